#include "parallel/checkpoint/optimizer_state.h"

#include "core/error.h"
#include "core/factory.h"  // defines: empty, zeros

namespace loom::distributed::checkpoint {
namespace {

constexpr const char* kGroups = "optim.param_groups.";

// The parameters of `optimizer` in its state_dict's numbering (across groups, in order).
std::vector<Tensor> numbered_params(const optim::Optimizer& optimizer) {
  std::vector<Tensor> out;
  for (const optim::ParamGroup& group : optimizer.param_groups())
    for (const Tensor& p : group.params) out.push_back(p);
  return out;
}

const LocalTensor& pieces_of(const ParamPieces& params, const Tensor& p, const optim::Optimizer& optimizer) {
  auto found = params.find(p.unsafe_impl());
  LOOM_CHECK(found != params.end(), optimizer.name(), " steps a parameter of shape ", p.shape(),
             " that the checkpoint's description of this rank's state does not hold; describe the tensors the "
             "optimizer steps (FSDP's shards, not the module's empty parameters)");
  return found->second;
}

}  // namespace

std::string optimizer_state_name(const std::string& parameter, const std::string& state) {
  return "optim." + parameter + "." + state;
}

ShardedState optimizer_pieces(const optim::Optimizer& optimizer, const ParamPieces& params, bool state_owned,
                              bool write_hyperparameters) {
  const std::vector<Tensor> numbered = numbered_params(optimizer);
  ShardedState out;
  for (const auto& [key, value] : optimizer.state_dict()) {
    if (key.rfind("param_groups.", 0) == 0) {
      if (key.size() < 7 || key.compare(key.size() - 7, 7, ".params") != 0)
        out.push_back(whole("optim." + key, value.contiguous(), write_hyperparameters));
      continue;
    }
    // "state.<i>.<name>"
    const size_t dot = key.find('.', 6);
    LOOM_CHECK(key.rfind("state.", 0) == 0 && dot != std::string::npos, optimizer.name(),
               ".state_dict: unexpected key ", key);
    const size_t i = std::stoul(key.substr(6, dot - 6));
    const std::string state = key.substr(dot + 1);
    const LocalTensor& param = pieces_of(params, numbered.at(i), optimizer);
    const Tensor t = value.contiguous();
    if (t.dim() == 0 && param.tensor.dim() != 0) {  // AdamW's step: whole, under each piece's name
      for (const Piece& piece : param.pieces)
        out.push_back(whole(optimizer_state_name(piece.name, state), t, state_owned || param.write));
      continue;
    }
    LOOM_CHECK(t.numel() == param.tensor.numel(), optimizer.name(), " state ", key, " has ", t.numel(),
               " elements but its parameter ", param.tensor.numel(), "; only states shaped like their parameter, or "
               "scalars, can be resharded");
    LocalTensor local = like(param, t, [&](const std::string& name) { return optimizer_state_name(name, state); });
    local.write = state_owned || param.write;
    out.push_back(std::move(local));
  }
  return out;
}

int load_optimizer_state(optim::Optimizer& optimizer, const CheckpointIndex& index, const ParamPieces& params) {
  OrderedDict<Tensor> state;
  for (const auto& [key, value] : optimizer.state_dict()) {
    if (key.rfind("state.", 0) == 0) continue;  // this layout's own state is replaced
    const std::string saved = "optim." + key;
    if (key.rfind("param_groups.", 0) == 0 && index.holds(saved)) {
      ShardedState one{whole(saved, empty({}, TensorOptions(kFloat64)))};
      load(index, one);
      state.insert(key, one[0].tensor);
    } else {
      state.insert(key, value);
    }
  }
  // Which states the checkpoint has for a parameter named `name`: "optim.<name>.<state>".
  auto saved_states = [&](const std::string& name) {
    std::vector<std::string> out;
    const std::string prefix = "optim." + name + ".";
    for (auto it = index.pieces.lower_bound(prefix); it != index.pieces.end() && it->first.rfind(prefix, 0) == 0; ++it) {
      const std::string rest = it->first.substr(prefix.size());
      if (rest.find('.') == std::string::npos) out.push_back(rest);  // not a deeper parameter's ("optim.fc.weight.x")
    }
    return out;
  };
  const std::vector<Tensor> numbered = numbered_params(optimizer);
  int restored = 0;
  for (size_t i = 0; i < numbered.size(); ++i) {
    const LocalTensor& param = pieces_of(params, numbered[i], optimizer);
    if (param.pieces.empty()) continue;  // a rank past the end of an uneven cut: nothing to hold
    bool any = false;
    for (const std::string& name : saved_states(param.pieces.front().name)) {
      const std::string first = optimizer_state_name(param.pieces.front().name, name);
      const SavedPiece& sample = index.pieces.at(first).front();
      const DType dtype = index.files.at(sample.file).tensors.find(sample.key)->dtype();
      ShardedState wanted;
      Tensor t;
      if (sample.global_shape.empty() && param.tensor.dim() != 0) {  // a scalar state: from the first piece's name
        t = empty({}, TensorOptions(dtype));
        wanted.push_back(whole(first, t));
      } else {
        t = zeros(param.tensor.shape(), TensorOptions(param.tensor.dtype()).device(param.tensor.device()));
        wanted.push_back(like(param, t, [&](const std::string& piece) { return optimizer_state_name(piece, name); }));
      }
      load(index, wanted);
      state.insert("state." + std::to_string(i) + "." + name, t);
      any = true;
    }
    restored += any ? 1 : 0;
  }
  optimizer.load_state_dict(state);
  return restored;
}

}  // namespace loom::distributed::checkpoint
