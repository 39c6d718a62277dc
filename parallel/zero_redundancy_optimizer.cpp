#include "parallel/zero_redundancy_optimizer.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <string>

#include "core/error.h"                  // defines: LOOM_CHECK, LOOM_FAIL
#include "core/factory.h"                // defines: empty, from_vector, scalar_tensor
#include "parallel/ddp/replica_sync.h"   // defines: verify_same_shapes

namespace loom::parallel {

std::vector<std::vector<std::vector<size_t>>> partition_parameters(
    const std::vector<std::vector<int64_t>>& group_numels, int world_size) {
  LOOM_CHECK(world_size > 0, "partition_parameters: world_size must be positive, got ", world_size);
  std::vector<std::vector<std::vector<size_t>>> owned(
      static_cast<size_t>(world_size), std::vector<std::vector<size_t>>(group_numels.size()));
  std::vector<int64_t> totals(static_cast<size_t>(world_size), 0);  // carried across groups
  for (size_t g = 0; g < group_numels.size(); ++g) {
    const std::vector<int64_t>& numels = group_numels[g];
    for (size_t i = 0; i < numels.size(); ++i)
      LOOM_CHECK(numels[i] >= 0, "partition_parameters: parameter ", i, " of group ", g, " has ", numels[i],
                 " elements");
    std::vector<size_t> largest_first(numels.size());
    std::iota(largest_first.begin(), largest_first.end(), size_t{0});
    std::stable_sort(largest_first.begin(), largest_first.end(),
                     [&](size_t a, size_t b) { return numels[a] > numels[b]; });
    for (size_t i : largest_first) {
      // min_element returns the first minimum: ties go to the lowest rank, as PyTorch's.
      const auto r = static_cast<size_t>(std::min_element(totals.begin(), totals.end()) - totals.begin());
      owned[r][g].push_back(i);
      totals[r] += numels[i];
    }
    for (auto& rank_groups : owned) std::sort(rank_groups[g].begin(), rank_groups[g].end());
  }
  return owned;
}

namespace {

// Every rank must have split its parameters into the same groups: the same shapes in a
// different grouping would give the ranks different partitions, and each would wait for
// broadcasts the others never send.
void verify_same_groups(distributed::Communicator& comm, const std::vector<optim::ParamGroup>& groups) {
  std::string sizes;
  int64_t hash = static_cast<int64_t>(groups.size());
  for (const optim::ParamGroup& g : groups) {
    hash = hash * 1000003 + static_cast<int64_t>(g.params.size());
    sizes += (sizes.empty() ? "" : ", ") + std::to_string(g.params.size());
  }
  std::vector<Tensor> all;
  Tensor mine = from_vector<int64_t>({static_cast<int64_t>(groups.size()), hash}, {2});
  comm.all_gather(all, distributed::to_communication_device(mine, comm))->wait();
  const std::vector<int64_t> mine_words = mine.tolist<int64_t>();
  for (int r = 0; r < comm.size(); ++r) {
    const std::vector<int64_t> theirs = all[static_cast<size_t>(r)].tolist<int64_t>();
    LOOM_CHECK(theirs == mine_words, "ZeroRedundancyOptimizer: the ranks split their parameters into different "
               "param groups: rank ", comm.rank(), " has ", groups.size(), " group(s) of sizes [", sizes, "], rank ",
               r, " has ", theirs[0], " group(s) of other sizes. Every rank must pass the same param groups");
  }
}

// One state tensor of one parameter ("momentum_buffer" of parameter 7), the parameter
// numbered as the whole optimizer numbers them (Note [Flat optimizer state]).
struct StateEntry {
  int64_t param;
  std::string name;
  Tensor value;
};

// Note [State entries as words]
// consolidate_state_dict sends a rank's entries to rank `to` as a count, then int64
// words describing every entry (parameter, dtype, ndim, dims..., name length, name
// bytes), then each entry's tensor: the receiver allocates each from its description.
std::vector<int64_t> describe(const std::vector<StateEntry>& entries) {
  std::vector<int64_t> w;
  for (const StateEntry& e : entries) {
    w.push_back(e.param);
    w.push_back(static_cast<int64_t>(e.value.dtype()));
    w.push_back(e.value.dim());
    for (int64_t d : e.value.shape()) w.push_back(d);
    w.push_back(static_cast<int64_t>(e.name.size()));
    for (char c : e.name) w.push_back(static_cast<unsigned char>(c));
  }
  return w;
}

// The entries `words` describe, each value an empty tensor on its parameter's device.
std::vector<StateEntry> parse(const std::vector<int64_t>& w, const std::vector<Tensor>& params, int from) {
  std::vector<StateEntry> out;
  auto word = [&](size_t k) {
    LOOM_CHECK(k < w.size(), "ZeroRedundancyOptimizer.consolidate_state_dict: rank ", from,
               " sent a truncated description of its state (", w.size(), " words)");
    return w[k];
  };
  for (size_t k = 0; k < w.size();) {
    const int64_t param = word(k);
    LOOM_CHECK(param >= 0 && param < static_cast<int64_t>(params.size()), "ZeroRedundancyOptimizer."
               "consolidate_state_dict: rank ", from, " sent state for parameter ", param, " of ", params.size());
    const auto dtype = static_cast<DType>(word(k + 1));
    const auto ndim = static_cast<size_t>(word(k + 2));
    Shape shape;
    for (size_t d = 0; d < ndim; ++d) shape.push_back(word(k + 3 + d));
    k += 3 + ndim;
    const auto length = static_cast<size_t>(word(k));
    std::string name;
    for (size_t c = 0; c < length; ++c) name += static_cast<char>(word(k + 1 + c));
    k += 1 + length;
    const Tensor& p = params[static_cast<size_t>(param)];
    out.push_back({param, name, empty(shape, TensorOptions(dtype).device(p.device()))});
  }
  return out;
}

}  // namespace

// What the constructor works out before the Optimizer base can be built: the groups with
// every hyperparameter filled in (by the wrapped optimizer itself), its defaults, the
// partition and this rank's local optimizer.
struct ZeroRedundancyOptimizer::Setup {
  std::shared_ptr<distributed::Communicator> comm;
  std::vector<optim::ParamGroup> groups;
  std::map<std::string, double> defaults;
  std::vector<std::vector<std::vector<size_t>>> owned;
  std::unique_ptr<optim::Optimizer> local;

  static Setup make(std::vector<optim::ParamGroup> groups, const OptimizerFactory& factory,
                    std::shared_ptr<distributed::Communicator> comm) {
    LOOM_CHECK(comm, "ZeroRedundancyOptimizer: the process group is null");
    LOOM_CHECK(factory, "ZeroRedundancyOptimizer: optimizer_class is empty");
    Setup s;
    s.comm = std::move(comm);
    {
      // The wrapped optimizer over every parameter, built and dropped at once (no state
      // yet): it checks the parameters and fills each group's hyperparameters as it
      // would alone, so the wrapper's param_groups() read exactly like its.
      std::unique_ptr<optim::Optimizer> whole = factory(std::move(groups));
      LOOM_CHECK(whole, "ZeroRedundancyOptimizer: optimizer_class returned null");
      s.groups = whole->param_groups();
      s.defaults = whole->defaults();
    }
    std::vector<Tensor> flat;
    std::vector<std::string> names;
    std::vector<std::vector<int64_t>> numels;
    for (size_t g = 0; g < s.groups.size(); ++g) {
      numels.emplace_back();
      for (size_t i = 0; i < s.groups[g].params.size(); ++i) {
        flat.push_back(s.groups[g].params[i]);
        names.push_back("group " + std::to_string(g) + ", parameter " + std::to_string(i));
        numels.back().push_back(s.groups[g].params[i].numel());
      }
    }
    verify_same_groups(*s.comm, s.groups);
    ddp::verify_same_shapes(*s.comm, flat, names, "parameter", "ZeroRedundancyOptimizer");
    s.owned = partition_parameters(numels, s.comm->size());

    std::vector<optim::ParamGroup> local_groups;
    size_t local_count = 0;
    for (size_t g = 0; g < s.groups.size(); ++g) {
      optim::ParamGroup part{{}, s.groups[g].options};
      for (size_t i : s.owned[static_cast<size_t>(s.comm->rank())][g]) part.params.push_back(s.groups[g].params[i]);
      local_count += part.params.size();
      local_groups.push_back(std::move(part));
    }
    // A rank that owns nothing (more ranks than parameters) has no optimizer at all:
    // optimizers refuse an empty parameter list.
    if (local_count > 0) s.local = factory(std::move(local_groups));
    return s;
  }
};

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(const std::vector<Tensor>& params, OptimizerFactory optimizer_class,
                                                 std::shared_ptr<distributed::Communicator> process_group)
    : ZeroRedundancyOptimizer(std::vector<optim::ParamGroup>{{params, {}}}, std::move(optimizer_class),
                              std::move(process_group)) {}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<optim::ParamGroup> groups,
                                                 OptimizerFactory optimizer_class,
                                                 std::shared_ptr<distributed::Communicator> process_group)
    : ZeroRedundancyOptimizer(Setup::make(std::move(groups), optimizer_class, std::move(process_group))) {}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(Setup setup)
    : Optimizer(std::move(setup.groups), std::move(setup.defaults), "ZeroRedundancyOptimizer"),
      comm_(std::move(setup.comm)),
      owned_(std::move(setup.owned)),
      local_(std::move(setup.local)) {}

void ZeroRedundancyOptimizer::add_param_group(optim::ParamGroup) {
  LOOM_FAIL("ZeroRedundancyOptimizer.add_param_group is not supported: the partition is fixed at construction. "
            "Pass every param group to the constructor");
}

std::vector<Tensor> ZeroRedundancyOptimizer::partition_tensors(int r) const {
  std::vector<Tensor> out;
  for (size_t g = 0; g < param_groups().size(); ++g)
    for (size_t i : owned_[static_cast<size_t>(r)][g]) out.push_back(param_groups()[g].params[i]);
  return out;
}

void ZeroRedundancyOptimizer::sync_hyperparameters_to_local() {
  if (!local_) return;
  // Schedulers and users edit the wrapper's groups; the local optimizer steps with them.
  for (size_t g = 0; g < param_groups().size(); ++g) local_->param_groups()[g].options = param_groups()[g].options;
}

// Note [Broadcast, not all-gather]
// After the local step, partition r's new values are on rank r only. Ways to spread them:
//   (a) one all_gather of every rank's partition packed flat, padded to the largest;
//   (b) one broadcast per owner of its partition packed flat (DDP's broadcast_coalesced);
//   (c) the same, all issued at once, each rank unpacking partition r while r+1 arrives;
//   (d) one broadcast per parameter, straight into the parameter, all issued at once.
// Each rank receives the same bytes in all four, but (a)-(c) stage them: a flat copy of
// every partition on every rank during the step (4 bytes per weight at once in (a) and
// (c): the very memory ZeRO-1 is there to save), plus a pack and an unpack copy. (d)
// needs neither, at the price of one collective per parameter (62 for ResNet18).
// Measured on this machine's gloo (shared memory; ResNet18's float32 parameters; ranks as
// threads on 2 busy cores; medians of 21 rounds, three interleaved runs at 2 ranks, two
// at 4):
//   2 ranks: (a) 12.8-25.4 ms  (b) 12.9-21.5  (c) 10.4-27.6  (d) 7.4-11.6
//   4 ranks: (a) 33.8-55.5 ms  (b) 55.4-57.4  (c) 30.0-44.1  (d) 18.5-22.8
// So loom broadcasts each parameter in place, as PyTorch does by default
// (parameters_as_bucket_view=False): the fastest here and no staging memory.
void ZeroRedundancyOptimizer::broadcast_partitions() {
  std::vector<std::shared_ptr<distributed::Work>> works;
  for (int r = 0; r < comm_->size(); ++r)
    for (const Tensor& p : partition_tensors(r)) works.push_back(comm_->broadcast(p.detach(), r));
  for (auto& work : works) work->wait();
  // The other ranks' parameters changed under autograd: as if written in place.
  for (int r = 0; r < comm_->size(); ++r)
    if (r != comm_->rank())
      for (const Tensor& p : partition_tensors(r)) p.bump_version();
}

void ZeroRedundancyOptimizer::step() {
  sync_hyperparameters_to_local();
  if (local_) local_->step();
  broadcast_partitions();  // See Note [Broadcast, not all-gather].
  // A consolidated copy now describes the previous step: drop it rather than save it.
  state_.clear();
  consolidated_to_ = -1;
}

void ZeroRedundancyOptimizer::consolidate_state_dict(int to) {
  const int world = comm_->size(), me = comm_->rank();
  LOOM_CHECK(to >= 0 && to < world, "ZeroRedundancyOptimizer.consolidate_state_dict: to=", to,
             " is not a rank of the process group (its ranks are 0 .. ", world - 1, ")");
  {
    // Every rank must name the same destination, or the sends would wait for a receiver
    // that never comes: check first, with a clear error on every rank.
    std::vector<Tensor> all;
    comm_->all_gather(all, distributed::to_communication_device(from_vector<int64_t>({to}, {1}), *comm_))->wait();
    for (int r = 0; r < world; ++r) {
      const int64_t theirs = all[static_cast<size_t>(r)].tolist<int64_t>()[0];
      LOOM_CHECK(theirs == to, "ZeroRedundancyOptimizer.consolidate_state_dict: rank ", me, " was called with to=", to,
                 " but rank ", r, " with to=", theirs, "; every rank must pass the same `to`");
    }
  }
  // This rank's state, renumbered from the local optimizer's order to the whole one's
  // (Note [Flat optimizer state] numbers parameters across groups in order).
  std::vector<int64_t> first_index;  // of each group, in the whole numbering
  std::vector<Tensor> all_params;
  for (const optim::ParamGroup& g : param_groups()) {
    first_index.push_back(static_cast<int64_t>(all_params.size()));
    all_params.insert(all_params.end(), g.params.begin(), g.params.end());
  }
  std::vector<int64_t> local_to_global;
  for (size_t g = 0; g < param_groups().size(); ++g)
    for (size_t i : owned_[static_cast<size_t>(me)][g]) local_to_global.push_back(first_index[g] + static_cast<int64_t>(i));

  std::vector<StateEntry> mine;
  if (local_) {
    for (const auto& [key, value] : local_->state_dict()) {
      if (key.rfind("state.", 0) != 0) continue;  // "state.<local index>.<name>"
      const size_t dot = key.find('.', 6);
      const auto local_index = static_cast<size_t>(std::stoll(key.substr(6, dot - 6)));
      mine.push_back({local_to_global[local_index], key.substr(dot + 1), value.contiguous()});
    }
  }

  // See Note [State entries as words]. Each transfer posts all its tensors before
  // waiting on any: a send completes only once its receive is posted.
  const Device meta = comm_->tensor_device();
  state_.clear();
  if (me == to) {
    for (const StateEntry& e : mine) state_[all_params[static_cast<size_t>(e.param)].unsafe_impl()].insert(e.name, e.value);
    for (int r = 0; r < world; ++r) {
      if (r == to) continue;
      Tensor count = empty({1}, TensorOptions(kInt64).device(meta));
      comm_->recv(count, r)->wait();
      Tensor words = empty({count.tolist<int64_t>()[0]}, TensorOptions(kInt64).device(meta));
      comm_->recv(words, r)->wait();
      std::vector<StateEntry> theirs = parse(words.tolist<int64_t>(), all_params, r);
      std::vector<std::shared_ptr<distributed::Work>> works;
      for (const StateEntry& e : theirs) works.push_back(comm_->recv(e.value, r));
      for (auto& work : works) work->wait();
      for (const StateEntry& e : theirs) state_[all_params[static_cast<size_t>(e.param)].unsafe_impl()].insert(e.name, e.value);
    }
  } else {
    const std::vector<int64_t> words = describe(mine);
    const auto n = static_cast<int64_t>(words.size());
    comm_->send(distributed::to_communication_device(from_vector<int64_t>({n}, {1}), *comm_), to)->wait();
    comm_->send(distributed::to_communication_device(from_vector<int64_t>(words, {n}), *comm_), to)->wait();
    std::vector<std::shared_ptr<distributed::Work>> works;
    for (const StateEntry& e : mine) works.push_back(comm_->send(e.value, to));
    for (auto& work : works) work->wait();
  }
  consolidated_to_ = to;
}

OrderedDict<Tensor> ZeroRedundancyOptimizer::state_dict() const {
  LOOM_CHECK(consolidated_to_ == comm_->rank(), "ZeroRedundancyOptimizer.state_dict on rank ", comm_->rank(), ": ",
             consolidated_to_ < 0 ? std::string("the state has not been consolidated since the last step")
                                  : "the state was consolidated on rank " + std::to_string(consolidated_to_),
             ". Call consolidate_state_dict(to) on every rank first, then state_dict() on rank `to`");
  return Optimizer::state_dict();  // the consolidated state_, in the wrapped optimizer's format
}

void ZeroRedundancyOptimizer::load_state_dict(const OrderedDict<Tensor>& state) {
  // The base checks the whole state against every group and loads it into state_; this
  // rank then keeps its partition's entries, renumbered for the local optimizer.
  Optimizer::load_state_dict(state);
  if (local_) {
    OrderedDict<Tensor> local_state;
    int64_t k = 0;
    for (size_t g = 0; g < param_groups().size(); ++g) {
      const std::string prefix = "param_groups." + std::to_string(g) + ".";
      for (const auto& [key, value] : param_groups()[g].options) local_state.insert(prefix + key, scalar_tensor(value, kFloat64));
      std::vector<int64_t> indices;
      for (size_t i : owned_[static_cast<size_t>(comm_->rank())][g]) {
        auto found = state_.find(param_groups()[g].params[i].unsafe_impl());
        if (found != state_.end())
          for (const auto& [name, t] : found->second) local_state.insert("state." + std::to_string(k) + "." + name, t);
        indices.push_back(k++);
      }
      local_state.insert(prefix + "params", from_vector(indices, {static_cast<int64_t>(indices.size())}));
    }
    local_->load_state_dict(local_state);
  }
  state_.clear();  // the other ranks' state is theirs to keep
  consolidated_to_ = -1;
}

namespace {

// What a rank's partition is, as tensors; see Note [ZeRO's sharded state].
OrderedDict<Tensor> partition_entries(const std::vector<std::vector<std::vector<size_t>>>& owned, int rank) {
  OrderedDict<Tensor> out;
  out.insert("partition.world_size", scalar_tensor(static_cast<double>(owned.size()), kInt64));
  out.insert("partition.rank", scalar_tensor(static_cast<double>(rank), kInt64));
  for (size_t g = 0; g < owned[static_cast<size_t>(rank)].size(); ++g) {
    std::vector<int64_t> indices(owned[static_cast<size_t>(rank)][g].begin(), owned[static_cast<size_t>(rank)][g].end());
    out.insert("partition.owned." + std::to_string(g), from_vector(indices, {static_cast<int64_t>(indices.size())}));
  }
  return out;
}

std::string describe_partition(const OrderedDict<Tensor>& entries) {
  std::string out;
  for (const auto& [key, value] : entries) {
    out += (out.empty() ? "" : ", ") + key.substr(10) + " ";
    out += value.dim() == 0 ? std::to_string(value.item<int64_t>()) : value.str();
  }
  return out;
}

}  // namespace

OrderedDict<Tensor> ZeroRedundancyOptimizer::sharded_state_dict() const {
  OrderedDict<Tensor> out;
  // The base's entries without any consolidated per-parameter state.
  for (const auto& [key, value] : Optimizer::state_dict())
    if (key.rfind("param_groups.", 0) == 0) out.insert(key, value);
  if (local_)
    for (const auto& [key, value] : local_->state_dict()) out.insert("local." + key, value.clone());
  for (const auto& [key, value] : partition_entries(owned_, comm_->rank())) out.insert(key, value);
  return out;
}

void ZeroRedundancyOptimizer::load_sharded_state_dict(const OrderedDict<Tensor>& state) {
  // See Note [ZeRO's sharded state]: the cut must be this rank's, entry for entry.
  const OrderedDict<Tensor> mine = partition_entries(owned_, comm_->rank());
  OrderedDict<Tensor> saved, groups, local_state;
  for (const auto& [key, value] : state) {
    if (key.rfind("partition.", 0) == 0) saved.insert(key, value);
    else if (key.rfind("param_groups.", 0) == 0) groups.insert(key, value);
    else if (key.rfind("local.", 0) == 0) local_state.insert(key.substr(6), value);
  }
  bool same = saved.size() == mine.size();
  for (const auto& [key, value] : mine) {
    const Tensor* was = saved.find(key);
    same = same && was && was->shape() == value.shape() && was->to(kInt64).tolist<int64_t>() == value.tolist<int64_t>();
  }
  LOOM_CHECK(same, "ZeroRedundancyOptimizer.load_sharded_state_dict: the state was cut for ",
             describe_partition(saved), " but this rank's partition is ", describe_partition(mine),
             ". A sharded state loads only at the world size and with the parameters that wrote it (resharding is "
             "not supported); a consolidated state (consolidate_state_dict) loads at any world size, and the state by "
             "parameter name (parallel/checkpoint/optimizer_state.h) under any partition");
  Optimizer::load_state_dict(groups);  // the hyperparameters (a scheduler's lr among them); no state
  if (local_) local_->load_state_dict(local_state);
  state_.clear();
  consolidated_to_ = -1;
}

std::vector<Tensor> ZeroRedundancyOptimizer::state_tensors() const {
  return local_ ? local_->state_tensors() : std::vector<Tensor>{};
}

}  // namespace loom::parallel
