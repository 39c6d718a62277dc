#include "parallel/fsdp/fully_sharded_data_parallel.h"

#include <map>
#include <set>

#include "autograd/grad_mode.h"           // defines: GradMode
#include "core/error.h"
#include "core/factory.h"                 // defines: from_vector
#include "core/trace.h"                   // defines: trace::Span
#include "parallel/ddp/replica_sync.h"    // defines: verify_same_shapes, broadcast_coalesced

namespace loom::fsdp {

using distributed::Communicator;

int replicas_for(int world_size, int shard_group_size) {
  LOOM_CHECK(shard_group_size >= 1 && world_size % shard_group_size == 0, "HYBRID_SHARD: the shard group size (",
             shard_group_size, ") must divide the world size (", world_size, ") so that the ranks split into equal "
             "replicas; try one of the divisors of ", world_size);
  return world_size / shard_group_size;
}

namespace {

// Every rank's (a, b) in `comm`, in group-rank order.
std::vector<std::pair<int64_t, int64_t>> all_gather_pair(Communicator& comm, int64_t a, int64_t b) {
  std::vector<Tensor> out;
  comm.all_gather(out, distributed::to_communication_device(from_vector<int64_t>({a, b}, {2}), comm))->wait();
  std::vector<std::pair<int64_t, int64_t>> pairs;
  for (const Tensor& t : out) {
    auto v = t.tolist<int64_t>();
    pairs.emplace_back(v[0], v[1]);
  }
  return pairs;
}

// Note [HYBRID_SHARD groups must form a grid]
// The shard groups cut the world into replicas; each replicate group takes one rank
// from every replica, the ranks that hold the same shard. Two mistakes break this and
// would silently average unrelated numbers: a replicate group whose ranks hold
// different shards (different shard-group ranks), or a shard group spread over several
// replicas. Each group checks its members agree on their rank in the other group.
void check_hybrid_groups(Communicator& shard, Communicator& replicate) {
  auto in_shard = all_gather_pair(shard, replicate.rank(), replicate.size());
  for (size_t r = 0; r < in_shard.size(); ++r) {
    LOOM_CHECK(in_shard[r] == in_shard[0], "HYBRID_SHARD: inconsistent groups: in the shard group of rank ",
               shard.rank(), ", member ", r, " is rank ", in_shard[r].first, " of a replicate group of size ",
               in_shard[r].second, " but member 0 is rank ", in_shard[0].first, " of one of size ", in_shard[0].second,
               ". The ranks of one shard group must form one replica: the same rank in replicate groups of the "
               "same size (see Note [HYBRID_SHARD groups must form a grid])");
  }
  auto in_replicate = all_gather_pair(replicate, shard.rank(), shard.size());
  for (size_t r = 0; r < in_replicate.size(); ++r) {
    LOOM_CHECK(in_replicate[r] == in_replicate[0], "HYBRID_SHARD: inconsistent groups: in the replicate group of "
               "rank ", replicate.rank(), ", member ", r, " holds shard ", in_replicate[r].first, " of ",
               in_replicate[r].second, " but member 0 holds shard ", in_replicate[0].first, " of ",
               in_replicate[0].second, ". A replicate group must join the ranks that hold the same shard (see Note "
               "[HYBRID_SHARD groups must form a grid])");
  }
}

}  // namespace

FullyShardedDataParallel::FullyShardedDataParallel(std::shared_ptr<nn::Module> module,
                                                   std::shared_ptr<Communicator> process_group, FSDPOptions options)
    : Module("FullyShardedDataParallel"), module_(std::move(module)) {
  LOOM_CHECK(process_group != nullptr, "FullyShardedDataParallel: the process group is null; call "
             "distributed::init_process_group() and pass distributed::default_group()");
  LOOM_CHECK(options.sharding_strategy != ShardingStrategy::HYBRID_SHARD, "FullyShardedDataParallel: HYBRID_SHARD "
             "needs two groups, (shard group, replicate group); pass them as a std::pair, as PyTorch's tuple form");
  if (options.sharding_strategy == ShardingStrategy::NO_SHARD) replicate_group_ = std::move(process_group);
  else shard_group_ = std::move(process_group);
  build(std::move(options));
}

FullyShardedDataParallel::FullyShardedDataParallel(
    std::shared_ptr<nn::Module> module,
    std::pair<std::shared_ptr<Communicator>, std::shared_ptr<Communicator>> process_groups, FSDPOptions options)
    : Module("FullyShardedDataParallel"),
      module_(std::move(module)),
      shard_group_(std::move(process_groups.first)),
      replicate_group_(std::move(process_groups.second)) {
  LOOM_CHECK(options.sharding_strategy == ShardingStrategy::HYBRID_SHARD, "FullyShardedDataParallel: two groups "
             "(shard, replicate) are for HYBRID_SHARD; ", strategy_name(options.sharding_strategy), " takes one");
  LOOM_CHECK(shard_group_ && replicate_group_, "FullyShardedDataParallel: HYBRID_SHARD needs both a shard group and "
             "a replicate group; got ", shard_group_ ? "a null replicate group" : "a null shard group");
  check_hybrid_groups(*shard_group_, *replicate_group_);
  build(std::move(options));
}

void FullyShardedDataParallel::broadcast_from_rank0(const std::vector<Tensor>& tensors,
                                                    const std::vector<std::string>& names, const char* what,
                                                    bool check_shapes) {
  // Shard group first, then across replicas: every rank ends with the values of rank 0
  // of replicate-group rank 0's shard group (global rank 0 in a mesh's layout).
  for (const auto& group : {shard_group_, replicate_group_}) {
    if (!group) continue;
    if (check_shapes) ddp::verify_same_shapes(*group, tensors, names, what);  // Note [Check shapes before broadcasting]
    ddp::broadcast_coalesced(*group, tensors, /*root=*/0, [](const Tensor&) { return ddp::Announcement(); }, names);
  }
}

void FullyShardedDataParallel::build(FSDPOptions options) {
  options_ = std::move(options);
  const bool frees = options_.sharding_strategy == ShardingStrategy::FULL_SHARD ||
                     options_.sharding_strategy == ShardingStrategy::HYBRID_SHARD;
  LOOM_CHECK(frees || !options_.reshard_after_forward.value_or(false), "FullyShardedDataParallel: "
             "reshard_after_forward frees units after their forward, which only FULL_SHARD and HYBRID_SHARD do; ",
             strategy_name(options_.sharding_strategy), " keeps them. Use FULL_SHARD, or leave it unset");
  LOOM_CHECK(options_.keep_last_gathered >= 0, "FullyShardedDataParallel: keep_last_gathered is the number of last "
             "units kept gathered from forward to backward, 0 or more; got ", options_.keep_last_gathered);
  std::shared_ptr<nn::Sequential> stages = stages_of(module_);

  // The names a single-process model gives its parameters (the first, for a shared one).
  std::map<const TensorImpl*, std::string> name_of;
  std::vector<Tensor> all_params;
  std::vector<std::string> all_names;
  for (const auto& [name, p] : module_->named_parameters()) {
    LOOM_CHECK(p.numel() > 0, "FullyShardedDataParallel: parameter \"", name, "\" of the module is empty (", p.str(),
               "). Was the module wrapped by an FSDP before? Its values then live in that FSDP's shards: wrap a "
               "fresh module, or load the old FSDP's full_state_dict into one");
    name_of.emplace(p.unsafe_impl(), name);
    all_params.push_back(p);
    all_names.push_back(name);
  }
  for (const auto& [name, b] : module_->named_buffers()) {
    buffers_.push_back(b);
    buffer_names_.push_back(name);
  }
  // Every rank starts from rank 0's parameters and buffers, as DDP.
  broadcast_from_rank0(all_params, all_names, "parameter", /*check_shapes=*/true);
  broadcast_from_rank0(buffers_, buffer_names_, "buffer", /*check_shapes=*/true);

  std::vector<std::string> types;
  for (const auto& stage : stages->children()) types.push_back(stage->type_name());
  std::vector<Unit> units;
  std::map<const TensorImpl*, std::string> unit_of;  // which unit already holds a parameter
  for (const UnitPlan& plan : plan_units(types, options_.auto_wrap_policy)) {
    Unit unit;
    unit.name = plan.name;
    std::vector<Tensor> params;
    std::vector<std::string> names;
    for (size_t s = plan.begin; s < plan.end; ++s) {
      unit.stages.push_back((*stages)[s]);
      for (const Tensor& p : (*stages)[s]->parameters()) {
        const auto it = name_of.find(p.unsafe_impl());
        LOOM_CHECK(it != name_of.end(), "FullyShardedDataParallel: stage ", s, " (", types[s], ") of unit ", plan.name,
                   " has a parameter the module does not register");
        auto [holder, inserted] = unit_of.emplace(p.unsafe_impl(), plan.name);
        if (!inserted && holder->second == plan.name) continue;  // shared within the unit: one slot
        LOOM_CHECK(inserted, "FullyShardedDataParallel: parameter \"", it->second, "\" is used by two units, ",
                   holder->second, " and ", plan.name, ". A unit's parameters live in its own flat buffer, which "
                   "is freed while other units run, so a parameter cannot be shared across units. Put the modules "
                   "that share it into one unit (a coarser auto_wrap_policy), or untie the weights");
        if (!p.requires_grad()) continue;  // frozen: stays replicated, as it is
        params.push_back(p);
        names.push_back(it->second);
      }
    }
    if (!params.empty())
      unit.flat = std::make_unique<FlatParameter>(std::move(params), std::move(names), shard_group_,
                                                  options_.per_parameter_sharding);
    units.push_back(std::move(unit));
  }
  for (const auto& [impl, name] : name_of) {
    LOOM_CHECK(unit_of.count(impl), "FullyShardedDataParallel: parameter \"", name, "\" is not used by any stage "
               "FSDP runs, so no unit holds it; the stages of a ", module_->type_name(), " must cover its parameters");
  }

  int world = 1;
  for (const auto& group : {shard_group_, replicate_group_})
    if (group) world *= group->size();
  runtime_ = Runtime::create(std::move(units), options_.sharding_strategy, shard_group_, replicate_group_, world,
                             options_.keep_last_gathered, options_.reshard_after_forward.value_or(frees));
  const std::vector<Tensor> shards = runtime_->shards();
  LOOM_CHECK(!shards.empty(), "FullyShardedDataParallel: the module (", module_->type_name(), ") has no parameter "
             "that requires grad; there is nothing to shard");
  if (options_.per_parameter_sharding) register_local_shards();
  else
    for (size_t k = 0; k < shards.size(); ++k) register_parameter("flat_param_" + std::to_string(k), shards[k]);
  training_ = module_->is_training();
}

namespace {
// Holds local shards at one place of the wrapped module's tree, under that module's type
// name; it computes nothing (FSDP runs the wrapped module).
class LocalShards : public nn::Module {
 public:
  explicit LocalShards(std::string type_name) : Module(std::move(type_name)) {}
};
}  // namespace

// Note [Local shards keep the single-process names]
// A module's parameter names are the paths of its registries ("layer1.0.conv1.weight" is
// parameter "weight" of child "conv1" of ...), and a name cannot contain '.'. So the FSDP
// module mirrors the wrapped module's tree with LocalShards nodes and registers each local
// shard where its parameter sits, walking the wrapped module's named_parameters() in its
// order: named_parameters() then yields the same names in the same order (frozen
// parameters, which stay replicated in the wrapped module, are left out), and anything
// that picks parameters by name (optim::param_groups_weight_decay, a user's weight-decay
// exemptions) works on the FSDP module as on the single-process model.
void FullyShardedDataParallel::register_local_shards() {
  std::map<const TensorImpl*, Tensor> local_of;
  for (const Unit& unit : units())
    if (unit.flat)
      for (size_t i = 0; i < unit.flat->params().size(); ++i)
        local_of.emplace(unit.flat->params()[i].unsafe_impl(), unit.flat->local_shards()[i]);
  OrderedDict<std::shared_ptr<nn::Module>> originals = module_->named_modules();
  for (const auto& [name, p] : module_->named_parameters()) {
    const auto local = local_of.find(p.unsafe_impl());
    if (local == local_of.end()) continue;  // frozen: not sharded
    nn::Module* holder = this;
    size_t begin = 0;
    for (size_t dot = name.find('.'); dot != std::string::npos; begin = dot + 1, dot = name.find('.', begin)) {
      const std::string part = name.substr(begin, dot - begin);
      auto children = holder->named_children();
      if (const auto* child = children.find(part)) {
        holder = child->get();
        continue;
      }
      const auto* original = originals.find(name.substr(0, dot));
      holder = holder->register_module(part, std::make_shared<LocalShards>(original ? (*original)->type_name()
                                                                                    : std::string("Module"))).get();
    }
    holder->register_parameter(name.substr(begin), local->second);
  }
}

void FullyShardedDataParallel::train(bool on) {
  Module::train(on);
  module_->train(on);
}

void FullyShardedDataParallel::sync_buffers() {
  trace::Span span("broadcast buffers", "fsdp");
  broadcast_from_rank0(buffers_, buffer_names_, "buffer", /*check_shapes=*/false);
}

Tensor FullyShardedDataParallel::forward(const Tensor& input) {
  // Module::train is not virtual, so `Module& m = fsdp; m.eval();` sets only this
  // module's flag (the wrapped module is not a registered child); it reaches the
  // wrapped module here.
  if (module_->is_training() != is_training()) module_->train(is_training());
  // As DDP: buffers are broadcast if the previous forward was a synchronised training one.
  if (options_.broadcast_buffers && require_forward_param_sync_ && !buffers_.empty()) sync_buffers();
  Tensor output = runtime_->forward(input);
  require_forward_param_sync_ = GradMode::is_enabled() && runtime_->sync();
  return output;
}

}  // namespace loom::fsdp
