// ZeroRedundancyOptimizer: ZeRO stage 1, as torch.distributed.optim.ZeroRedundancyOptimizer.
// Under DDP every rank keeps the whole optimizer state (SGD: one momentum buffer per
// parameter, 4 bytes per weight) and takes the same step as every other rank. Here each
// rank keeps the state of its 1/N of the parameters only, steps only those, and sends
// the updated values to the others: the optimizer state is sharded, nothing else is.
//
//   ddp::DistributedDataParallel ddp(model, comm);      // averages the gradients
//   parallel::ZeroRedundancyOptimizer opt(ddp.parameters(),
//       parallel::optimizer_class<optim::SGD>(optim::SGDOptions{.lr = 0.1, .momentum = 0.9}), comm);
//   opt.zero_grad(); loss.backward(); opt.step();       // the loop is DDP's
//   opt.consolidate_state_dict(0);                      // every rank: a collective
//   if (rank == 0) save(opt.state_dict());              // a plain SGD's whole state
//
// One step, N = 2 (docs/sharding.md has the memory arithmetic):
//
//   rank 0: grads (all, averaged by DDP) ─► SGD over partition 0 ─► params of 0 ─┐
//   rank 1: grads (all, averaged by DDP) ─► SGD over partition 1 ─► params of 1 ─┤
//                              broadcast each parameter from its owner, in place ┘
//           ─► every rank holds every updated parameter, as after DDP + SGD
//
// It is an optim::Optimizer: param_groups() hold every parameter with the group's
// hyperparameters, so LR schedulers and zero_grad work on it as on the wrapped optimizer;
// step() hands the hyperparameters to the local optimizer first.
//
// Note [Same arithmetic, same bits]
// The owner of a parameter runs the wrapped optimizer's own update on the same averaged
// gradient that every DDP rank would, and the other ranks receive its bytes: so after any
// number of steps the weights equal DDP + that optimizer's bit for bit (the transparency
// test in tests/test_zero_redundancy_optimizer.cpp asserts equality, not a tolerance).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "nn/optim/optimizer.h"              // defines: Optimizer, ParamGroup
#include "parallel/comm/communicator.h"      // defines: Communicator

namespace loom::parallel {

// Builds the wrapped optimizer over some param groups (PyTorch's optimizer_class plus
// its **defaults). Groups it receives may be empty on some ranks; they keep their index.
using OptimizerFactory = std::function<std::unique_ptr<optim::Optimizer>(std::vector<optim::ParamGroup>)>;

// optimizer_class<optim::SGD>(optim::SGDOptions{.lr = 0.1}): a factory for any optimizer
// with a (groups, options) constructor.
template <typename Opt, typename Options>
OptimizerFactory optimizer_class(Options options) {
  return [options](std::vector<optim::ParamGroup> groups) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<Opt>(std::move(groups), options);
  };
}

// Note [Greedy partition]
// Which rank owns (keeps the state of, and steps) which parameter: PyTorch's
// _partition_parameters. Within each param group, the parameters are taken largest first
// (ties: registration order) and each goes to the rank with the fewest elements so far
// (ties: the lowest rank); the totals carry over from group to group, so the whole
// partition is balanced, and so that a later group never moves an earlier one's
// parameters. Groups are respected: a rank's share of group g stays in group g of its
// local optimizer, with g's hyperparameters. A pure function of sizes, tested alone.
//
// group_numels[g][i]: the element count of parameter i of group g. Returns owned[r][g]:
// the indices i of group g that rank r owns, ascending. With more ranks than
// parameters, some ranks own nothing.
std::vector<std::vector<std::vector<size_t>>> partition_parameters(
    const std::vector<std::vector<int64_t>>& group_numels, int world_size);

class ZeroRedundancyOptimizer : public optim::Optimizer {
 public:
  // Collective: every rank of `process_group` constructs it at the same point, over the
  // same parameters (checked: a rank with different shapes or groups gets a clear error).
  ZeroRedundancyOptimizer(const std::vector<Tensor>& params, OptimizerFactory optimizer_class,
                          std::shared_ptr<distributed::Communicator> process_group);
  ZeroRedundancyOptimizer(std::vector<optim::ParamGroup> groups, OptimizerFactory optimizer_class,
                          std::shared_ptr<distributed::Communicator> process_group);

  // Collective. Syncs the hyperparameters into the local optimizer, steps this rank's
  // partition, then broadcasts every parameter from its owner, in place (Note [Broadcast,
  // not all-gather]).
  void step() override;

  // Collective: rank `to` receives every rank's state and afterwards state_dict() there is
  // the whole state, exactly as the wrapped optimizer alone would write it (Note [Flat
  // optimizer state]), so a plain SGD can load it. The other ranks only send.
  void consolidate_state_dict(int to = 0);
  // Only on the rank that consolidated, and only until the next step (the copy would be
  // stale); elsewhere a loom::Error saying to call consolidate_state_dict first.
  OrderedDict<Tensor> state_dict() const override;
  // A whole state (from state_dict() or a plain optimizer's); every rank keeps the state
  // of its own partition and every group's hyperparameters. Not a collective.
  void load_state_dict(const OrderedDict<Tensor>& state) override;
  // Note [ZeRO's sharded state]
  // This rank's partition only, as PyTorch's SHARDED_STATE_DICT keeps each rank's piece:
  //   "param_groups.<g>.*"   every group's hyperparameters and size, as in the whole state
  //   "local.*"              the local optimizer's own state_dict (its partition's state)
  //   "partition.world_size", "partition.rank", "partition.owned.<g>"  the cut it belongs to
  // Not a collective: each rank writes its own file (parallel/distributed_checkpoint.h).
  // load_sharded_state_dict refuses a state cut for another world size or partition,
  // naming both (resharding is not supported: consolidate_state_dict writes a whole state
  // that any world size loads).
  OrderedDict<Tensor> sharded_state_dict() const;
  void load_sharded_state_dict(const OrderedDict<Tensor>& state);
  // This rank's state only: what it really holds (the consolidated copy is not counted).
  std::vector<Tensor> state_tensors() const override;
  // Not supported: build the ZeroRedundancyOptimizer with every group.
  void add_param_group(optim::ParamGroup group) override;

  // The wrapped optimizer over this rank's partition; null when the rank owns nothing.
  optim::Optimizer* local_optimizer() const { return local_.get(); }
  // owned()[r][g]: indices within group g that rank r owns (partition_parameters).
  const std::vector<std::vector<std::vector<size_t>>>& partition() const { return owned_; }
  distributed::Communicator& process_group() const { return *comm_; }

 private:
  struct Setup;
  ZeroRedundancyOptimizer(Setup setup);
  // Rank r's parameters, every group's in order.
  std::vector<Tensor> partition_tensors(int r) const;
  void sync_hyperparameters_to_local();
  void broadcast_partitions();

  std::shared_ptr<distributed::Communicator> comm_;
  std::vector<std::vector<std::vector<size_t>>> owned_;
  std::unique_ptr<optim::Optimizer> local_;
  int consolidated_to_ = -1;  // the rank holding a consolidated state; -1: none since the last step
};

}  // namespace loom::parallel
