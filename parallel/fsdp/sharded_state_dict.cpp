#include "parallel/fsdp/sharded_state_dict.h"

#include <algorithm>  // defines: std::max
#include <set>

#include "autograd/grad_mode.h"  // defines: NoGradGuard
#include "core/error.h"

namespace loom::fsdp {
namespace {

std::string flat_param_name(size_t k) { return "flat_param_" + std::to_string(k); }

// The wrapped module's state that FSDP does not shard: buffers (BatchNorm's running
// statistics), frozen parameters, the empty second name of a shared parameter.
OrderedDict<Tensor> replicated_state(const FullyShardedDataParallel& fsdp) {
  std::set<std::string> in_units;
  for (const Unit& unit : fsdp.units())
    if (unit.flat) in_units.insert(unit.flat->names().begin(), unit.flat->names().end());
  OrderedDict<Tensor> out;
  for (const auto& [name, value] : fsdp.module()->state_dict())
    if (!in_units.count(name)) out.insert(name, value);
  return out;
}

int group_size(const std::shared_ptr<distributed::Communicator>& group) { return group ? group->size() : 1; }

}  // namespace

OrderedDict<Tensor> sharded_state_dict(const FullyShardedDataParallel& fsdp) {
  OrderedDict<Tensor> out;
  size_t k = 0;
  for (const Unit& unit : fsdp.units())
    if (unit.flat) out.insert(flat_param_name(k++), unit.flat->shard().detach().clone());
  for (const auto& [name, value] : replicated_state(fsdp)) out.insert(name, value.clone());
  return out;
}

void load_sharded_state_dict(FullyShardedDataParallel& fsdp, const OrderedDict<Tensor>& state) {
  std::vector<std::pair<std::string, Tensor>> shards, replicated;  // (key, where its value goes)
  size_t k = 0;
  for (const Unit& unit : fsdp.units())
    if (unit.flat) shards.emplace_back(flat_param_name(k++), unit.flat->shard());
  for (const auto& [name, value] : replicated_state(fsdp)) replicated.emplace_back(name, value);
  std::string missing, unexpected;
  std::set<std::string> known;
  for (const auto* targets : {&shards, &replicated}) {
    for (const auto& [key, target] : *targets) {
      known.insert(key);
      if (!state.contains(key)) missing += (missing.empty() ? "" : ", ") + key;
      else if (state.find(key)->shape() != target.shape())
        LOOM_FAIL("FSDP load_sharded_state_dict: \"", key, "\" has shape ", state.find(key)->shape(), " in the state "
                  "but ", target.shape(), " here; was it written with another world size or sharding strategy? "
                  "(check_sharded_compatible says which)");
    }
  }
  for (const std::string& key : state.keys())
    if (!known.count(key)) unexpected += (unexpected.empty() ? "" : ", ") + key;
  LOOM_CHECK(missing.empty() && unexpected.empty(), "FSDP load_sharded_state_dict: the state does not match this "
             "FSDP's shards.", missing.empty() ? "" : " Missing keys: " + missing + ".",
             unexpected.empty() ? "" : " Unexpected keys: " + unexpected + ".", " A sharded state dict holds "
             "\"flat_param_<k>\" shards and the wrapped module's buffers, as sharded_state_dict wrote them; a full "
             "state dict (the single-process names) loads with load_full_state_dict");
  k = 0;
  for (const Unit& unit : fsdp.units())
    if (unit.flat) unit.flat->load_shard_values(*state.find(flat_param_name(k++)));
  NoGradGuard no_grad;
  for (const auto& [key, target] : replicated) Tensor(target).copy_(*state.find(key));
}

safetensors::Metadata sharding_metadata(const FullyShardedDataParallel& fsdp) {
  safetensors::Metadata out;
  const int shard = group_size(fsdp.shard_group()), replicas = group_size(fsdp.replicate_group());
  // NO_SHARD's shard group is absent and its replicate group is the whole world.
  out.insert("fsdp.world_size", std::to_string(fsdp.shard_group() && fsdp.replicate_group() ? shard * replicas
                                                                                            : std::max(shard, replicas)));
  out.insert("fsdp.sharding_strategy", strategy_name(fsdp.sharding_strategy()));
  out.insert("fsdp.shard_group_size", std::to_string(shard));
  // Only the per-parameter layout says so: the flat layout's checkpoints, written before
  // there was another, have no such key.
  if (fsdp.per_parameter_sharding()) out.insert("fsdp.layout", "per_parameter");
  size_t k = 0;
  for (const Unit& unit : fsdp.units()) {
    if (!unit.flat) continue;
    const FlatParameter& flat = *unit.flat;
    const FlatParamLayout& layout = flat.layout();
    std::string names;
    for (const std::string& name : flat.names()) names += (names.empty() ? "" : ",") + name;
    out.insert("fsdp." + flat_param_name(k++),
               names + " total " + std::to_string(layout.total) + " padded " + std::to_string(layout.padded) +
                   " shard " + std::to_string(layout.shard_size) + " " + dtype_name(flat.shard().dtype()));
  }
  return out;
}

void check_sharded_compatible(const FullyShardedDataParallel& fsdp, const safetensors::Metadata& saved,
                              const std::string& source) {
  // See Note [What a shard must agree on].
  const safetensors::Metadata now = sharding_metadata(fsdp);
  std::string differences;
  auto differ = [&](const std::string& key, const std::string& was, const std::string& is) {
    differences += "\n  " + key.substr(5) + ": the checkpoint has " + (was.empty() ? "nothing" : was) +
                   ", this run has " + (is.empty() ? "nothing" : is);
  };
  for (const auto& [key, value] : now) {
    const std::string* was = saved.find(key);
    if (!was || *was != value) differ(key, was ? *was : "", value);
  }
  for (const auto& [key, value] : saved)
    if (key.rfind("fsdp.", 0) == 0 && !now.contains(key)) differ(key, value, "");
  LOOM_CHECK(differences.empty(), "FSDP sharded checkpoint ", source, " was cut for another layout:", differences,
             "\nA sharded checkpoint loads only into the same world size, sharding strategy and model that wrote it "
             "(resharding is not supported). Resume with the checkpoint's world size and strategy, or save a full "
             "state dict instead (fsdp::full_state_dict), which loads at any world size, or pieces "
             "(parallel/checkpoint/fsdp_state.h), which load under any layout");
}

}  // namespace loom::fsdp
