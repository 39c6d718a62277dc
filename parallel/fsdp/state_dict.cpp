#include "parallel/fsdp/state_dict.h"

#include <set>

#include "autograd/grad_mode.h"  // defines: NoGradGuard
#include "autograd/ops.h"        // defines: cat
#include "core/error.h"
#include "nn/safetensors.h"      // defines: nn::save

namespace loom::fsdp {

namespace {

bool is_rank0(const FullyShardedDataParallel& fsdp) {
  return (!fsdp.shard_group() || fsdp.shard_group()->rank() == 0) &&
         (!fsdp.replicate_group() || fsdp.replicate_group()->rank() == 0);
}


// The flat parameter behind each of the optimizer's parameters, in its numbering
// (across groups, in order): they must all be this FSDP's shards.
std::vector<const FlatParameter*> flats_of(const FullyShardedDataParallel& fsdp, const optim::Optimizer& optimizer) {
  std::vector<const FlatParameter*> out;
  for (const optim::ParamGroup& group : optimizer.param_groups()) {
    for (const Tensor& p : group.params) {
      const FlatParameter* found = nullptr;
      for (const Unit& unit : fsdp.units())
        if (unit.flat && unit.flat->shard().is_same(p)) found = unit.flat.get();
      LOOM_CHECK(found, "FSDP optimizer state: parameter ", out.size(), " of the ", optimizer.name(), " optimizer (",
                 p.str(), ") is not one of this FSDP's shards; build the optimizer over fsdp.parameters()");
      out.push_back(found);
    }
  }
  return out;
}

// "state.<i>.<name>" -> i, or -1 for any other key.
int64_t state_index(const std::string& key) {
  if (key.rfind("state.", 0) != 0) return -1;
  const size_t dot = key.find('.', 6);
  return dot == std::string::npos ? -1 : std::stoll(key.substr(6, dot - 6));
}

}  // namespace

OrderedDict<Tensor> full_optim_state_dict(FullyShardedDataParallel& fsdp, const optim::Optimizer& optimizer,
                                          bool rank0_only) {
  const std::vector<const FlatParameter*> flats = flats_of(fsdp, optimizer);
  const bool keep = !rank0_only || is_rank0(fsdp);
  OrderedDict<Tensor> out;
  // Every rank walks the same keys in the same order, so the all-gathers pair up.
  for (const auto& [key, value] : optimizer.state_dict()) {
    const int64_t i = state_index(key);
    const bool sharded = i >= 0 && static_cast<size_t>(i) < flats.size() &&
                         value.shape() == flats[static_cast<size_t>(i)]->shard().shape();
    Tensor full = sharded ? flats[static_cast<size_t>(i)]->gather_full(value) : value;
    if (keep) out.insert(key, sharded ? full : value.clone());
  }
  return out;
}

void load_full_optim_state_dict(FullyShardedDataParallel& fsdp, optim::Optimizer& optimizer,
                                const OrderedDict<Tensor>& state) {
  const std::vector<const FlatParameter*> flats = flats_of(fsdp, optimizer);
  OrderedDict<Tensor> mine;
  for (const auto& [key, value] : state) {
    const int64_t i = state_index(key);
    const bool full = i >= 0 && static_cast<size_t>(i) < flats.size() && value.dim() == 1 &&
                      value.numel() == flats[static_cast<size_t>(i)]->layout().total;
    mine.insert(key, full ? flats[static_cast<size_t>(i)]->shard_of(value) : value);
  }
  optimizer.load_state_dict(mine);
}

OrderedDict<Tensor> full_state_dict(FullyShardedDataParallel& fsdp, bool rank0_only) {
  OrderedDict<Tensor> out;
  fsdp.runtime().with_all_gathered([&] {
    if (rank0_only && !is_rank0(fsdp)) return;
    for (const auto& [name, value] : fsdp.module()->state_dict()) out.insert(name, value.clone());
  });
  return out;
}

void save_full_state_dict(FullyShardedDataParallel& fsdp, const std::string& path) {
  fsdp.runtime().with_all_gathered([&] {
    if (is_rank0(fsdp)) nn::save(*fsdp.module(), path);
  });
}

void load_full_state_dict(FullyShardedDataParallel& fsdp, const OrderedDict<Tensor>& state) {
  const OrderedDict<Tensor> own = fsdp.module()->state_dict();
  std::string missing, unexpected;
  for (const std::string& key : own.keys())
    if (!state.contains(key)) missing += (missing.empty() ? "" : ", ") + key;
  for (const std::string& key : state.keys())
    if (!own.contains(key)) unexpected += (unexpected.empty() ? "" : ", ") + key;
  LOOM_CHECK(missing.empty() && unexpected.empty(), "FSDP load_full_state_dict: the state dict does not match the "
             "wrapped ", fsdp.module()->type_name(), ".", missing.empty() ? "" : " Missing keys: " + missing + ".",
             unexpected.empty() ? "" : " Unexpected keys: " + unexpected + ".", " A full state dict has the "
             "single-process names (as nn::save writes them), without an FSDP or DDP \"module.\" prefix");
  NoGradGuard no_grad;
  std::set<std::string> in_units;
  for (const Unit& unit : fsdp.units()) {
    if (!unit.flat) continue;
    const FlatParameter& flat = *unit.flat;
    std::vector<Tensor> parts;
    for (size_t i = 0; i < flat.names().size(); ++i) {
      const std::string& name = flat.names()[i];
      const Tensor& value = *state.find(name);
      LOOM_CHECK(value.shape() == flat.shapes()[i], "FSDP load_full_state_dict: \"", name, "\" has shape ",
                 value.shape(), " in the state dict but ", flat.shapes()[i], " in the model");
      parts.push_back(value.to(flat.shard().device()).to(flat.shard().dtype()).reshape({-1}));
      in_units.insert(name);
    }
    unit.flat->load_full_values(cat(parts, 0));
  }
  // Buffers and frozen parameters are replicated: copied as they are.
  for (const auto& [key, target] : own) {
    if (in_units.count(key)) continue;
    const Tensor& value = *state.find(key);
    if (target.numel() == 0 && value.numel() != 0) continue;  // a shared parameter's second name: loaded via its first
    LOOM_CHECK(value.shape() == target.shape(), "FSDP load_full_state_dict: \"", key, "\" has shape ", value.shape(),
               " in the state dict but ", target.shape(), " in the model");
    Tensor(target).copy_(value);
  }
}

}  // namespace loom::fsdp
