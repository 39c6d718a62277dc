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

// Every unit gathered (all-gathers issued first, then waited, so they overlap), fn run,
// every unit freed again, even when fn throws.
template <typename Fn>
void with_all_gathered(FullyShardedDataParallel& fsdp, Fn&& fn) {
  for (const Unit& unit : fsdp.units())
    if (unit.flat) unit.flat->gather_async();
  for (const Unit& unit : fsdp.units())
    if (unit.flat) unit.flat->wait_gathered();
  try {
    fn();
  } catch (...) {
    fsdp.runtime().release_all();
    throw;
  }
  fsdp.runtime().release_all();
}

}  // namespace

OrderedDict<Tensor> full_state_dict(FullyShardedDataParallel& fsdp, bool rank0_only) {
  OrderedDict<Tensor> out;
  with_all_gathered(fsdp, [&] {
    if (rank0_only && !is_rank0(fsdp)) return;
    for (const auto& [name, value] : fsdp.module()->state_dict()) out.insert(name, value.clone());
  });
  return out;
}

void save_full_state_dict(FullyShardedDataParallel& fsdp, const std::string& path) {
  with_all_gathered(fsdp, [&] {
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
