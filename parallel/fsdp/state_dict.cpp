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


// What one of the optimizer's parameters is: a unit's flat shard (local = -1), or the
// local shard of the unit's parameter `local` (the per-parameter layout).
struct Stepped {
  const FlatParameter* flat = nullptr;
  int64_t local = -1;
  // Whether `value` (a state tensor of the parameter) is laid out like the parameter.
  bool shaped_like(const Tensor& value) const {
    return value.shape() == (local < 0 ? flat->shard() : flat->local_shards()[static_cast<size_t>(local)]).shape();
  }
};

// The flat parameter behind each of the optimizer's parameters, in its numbering
// (across groups, in order): they must all be this FSDP's sharded parameters.
std::vector<Stepped> flats_of(const FullyShardedDataParallel& fsdp, const optim::Optimizer& optimizer) {
  std::vector<Stepped> out;
  for (const optim::ParamGroup& group : optimizer.param_groups()) {
    for (const Tensor& p : group.params) {
      Stepped found;
      for (const Unit& unit : fsdp.units()) {
        if (!unit.flat) continue;
        if (unit.flat->shard().is_same(p)) found = {unit.flat.get(), -1};
        const std::vector<Tensor>& locals = unit.flat->local_shards();
        for (size_t i = 0; i < locals.size(); ++i)
          if (locals[i].is_same(p)) found = {unit.flat.get(), static_cast<int64_t>(i)};
      }
      LOOM_CHECK(found.flat, "FSDP optimizer state: parameter ", out.size(), " of the ", optimizer.name(),
                 " optimizer (", p.str(), ") is not one of this FSDP's sharded parameters; build the optimizer over "
                 "fsdp.parameters()");
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
  const std::vector<Stepped> flats = flats_of(fsdp, optimizer);
  const bool keep = !rank0_only || is_rank0(fsdp);
  OrderedDict<Tensor> out;
  // Every rank walks the same keys in the same order, so the all-gathers pair up.
  for (const auto& [key, value] : optimizer.state_dict()) {
    const int64_t i = state_index(key);
    const Stepped* of = i >= 0 && static_cast<size_t>(i) < flats.size() ? &flats[static_cast<size_t>(i)] : nullptr;
    const bool sharded = of && of->shaped_like(value);
    Tensor full = !sharded     ? value
                  : of->local < 0 ? of->flat->gather_full(value)
                                  : of->flat->gather_full_param(static_cast<size_t>(of->local), value);
    if (keep) out.insert(key, sharded ? full : value.clone());
  }
  return out;
}

void load_full_optim_state_dict(FullyShardedDataParallel& fsdp, optim::Optimizer& optimizer,
                                const OrderedDict<Tensor>& state) {
  const std::vector<Stepped> flats = flats_of(fsdp, optimizer);
  OrderedDict<Tensor> mine;
  for (const auto& [key, value] : state) {
    const int64_t i = state_index(key);
    const Stepped* of = i >= 0 && static_cast<size_t>(i) < flats.size() ? &flats[static_cast<size_t>(i)] : nullptr;
    if (of && of->local < 0 && value.dim() == 1 && value.numel() == of->flat->layout().total) {
      mine.insert(key, of->flat->shard_of(value));
      continue;
    }
    // A per-parameter state tensor consolidates to its parameter's full shape ([1] for a
    // 0-d parameter, never a 0-d "step").
    const size_t local = of ? static_cast<size_t>(of->local) : 0;
    const bool full_param = of && of->local >= 0 && value.dim() > 0 &&
                            value.numel() == numel(of->flat->shapes()[local]) &&
                            (value.shape() == of->flat->shapes()[local] || value.dim() == 1);
    mine.insert(key, full_param ? of->flat->local_of(local, value) : value);
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
