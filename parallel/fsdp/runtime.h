// The life of FSDP's units during one training step: gathers before each unit runs
// (prefetched one unit ahead), frees after, reduce-scatters gradients from hooks while
// backward goes on (as PyTorch's torch/distributed/fsdp/_runtime_utils.py).
//
//   forward   unit 0          unit 1          unit 2 (last)
//   comm      AG0 AG1 ....... AG2 ........... (nothing)        AG: all_gather (prefetched)
//   compute       [fwd 0]free     [fwd 1]free     [fwd 2]      free: FULL_SHARD only; the
//                                                               last unit is kept, its backward
//                                                               is next (Note [Which units stay gathered])
//   backward  [bwd 2]RS2  [bwd 1]RS1  [bwd 0]RS0 -> finalize    RS: reduce_scatter
//   comm      AG1 ......  AG0 ......                            (re-gather what FULL_SHARD freed)
//
// Under a pipeline (parallel/pipeline/stage_sharding.h) one step runs many forwards and
// backwards of the same units, one per micro-batch; set_sync and set_reshard_after_backward
// say, before each backward, whether it is the step's last (Note [FSDP under a pipeline]).
//
// Hooks (all fire on the backward thread):
// - pre-backward: a hook on each unit's output gradient. It fires just before the unit's
//   backward: gather the unit (if freed), prefetch the unit before it. The first one also
//   queues finalize() with the autograd engine (Note [Final callbacks]).
// - post-accumulate-grad on every parameter: when all of a unit's parameters have their
//   gradients, the unit's backward is over: launch its reduce-scatter and free it.
// - finalize, when backward ends: wait for the reduce-scatters (and, with a replicate
//   group, all-reduce the shards' gradients across replicas), write the shards' .grad().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nn/module.h"
#include "parallel/comm/communicator.h"
#include "parallel/fsdp/flat_param.h"  // defines: FlatParameter

namespace loom::fsdp {

// As torch.distributed.fsdp.ShardingStrategy.
enum class ShardingStrategy {
  FULL_SHARD,     // ZeRO-3: parameters, gradients and optimizer state sharded; free after forward
  SHARD_GRAD_OP,  // ZeRO-2: gradients and optimizer state sharded; parameters kept from forward to backward
  NO_SHARD,       // DDP: everything replicated, gradients all-reduced
  HYBRID_SHARD,   // FULL_SHARD within the shard group, all-reduce across the replicate group
};
const char* strategy_name(ShardingStrategy strategy);
// "full_shard", "shard_grad_op", "no_shard", "hybrid_shard" (any case); else a loom::Error.
ShardingStrategy parse_sharding_strategy(const std::string& name);

struct Unit {
  std::string name;
  std::vector<std::shared_ptr<nn::Module>> stages;
  std::unique_ptr<FlatParameter> flat;  // null for a unit without trainable parameters
};

class Runtime : public std::enable_shared_from_this<Runtime> {
 public:
  // shard_group: null for NO_SHARD. replicate_group: null unless gradients are also
  // all-reduced (NO_SHARD: the process group; HYBRID_SHARD: across shard groups).
  // world: ranks the gradient is averaged over. keep_last_gathered: FSDPOptions'.
  // reshard_after_forward: whether units (but the kept ones) are freed after their
  // forward; only FULL_SHARD and HYBRID_SHARD may free.
  static std::shared_ptr<Runtime> create(std::vector<Unit> units, ShardingStrategy strategy,
                                         std::shared_ptr<distributed::Communicator> shard_group,
                                         std::shared_ptr<distributed::Communicator> replicate_group, int world,
                                         int keep_last_gathered = 1, bool reshard_after_forward = true);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  Tensor forward(const Tensor& input);
  const std::vector<Unit>& units() const { return units_; }
  // The flat shards, in unit order.
  std::vector<Tensor> shards() const;
  // What the optimizer steps, in unit order: the FSDP module's parameters. The flat
  // shards, or under the per-parameter layout each unit's local shards.
  std::vector<Tensor> sharded_params() const;
  // false: the backwards from now on accumulate full gradients on the module's
  // parameters, without communication (no_sync(), FSDP2's set_requires_gradient_sync);
  // the next synchronised one reduces them. Read when a backward starts. A promise, too:
  // no optimizer step or checkpoint load comes before that synchronised backward (Note
  // [When one-sided gathers may read]).
  void set_sync(bool sync) { sync_ = sync; }
  bool sync() const { return sync_; }
  // false: a backward that does not reduce (set_sync(false)) leaves its units gathered,
  // so that the next micro-batch's forward and backward need no gather (FSDP2's
  // set_reshard_after_backward). A reducing backward always frees them: Note [FSDP
  // under a pipeline].
  void set_reshard_after_backward(bool on) { reshard_after_backward_ = on; }
  bool reshard_after_backward() const { return reshard_after_backward_; }
  bool reshard_after_forward() const { return reshard_after_forward_; }

  // What this runtime has issued since it was built: for tests and docs that set a
  // strategy's traffic against its formula.
  struct CommCounts {
    int64_t all_gathers = 0;      // units gathered (collective all_gathers or one-sided copies)
    int64_t reduce_scatters = 0;  // units whose gradients were reduce-scattered
    int64_t all_reduces = 0;      // units whose gradients were all-reduced across replicas
    int64_t barriers = 0;         // Note [When one-sided gathers may read]
  };
  CommCounts comm_counts() const;
  // Releases every gathered unit (after a checkpoint gather, say).
  void release_all();
  // Gathers every unit (all issued first, then waited) and releases them again after
  // `fn`, even when it throws: for checkpoints. Collective, like a forward.
  void with_all_gathered(const std::function<void()>& fn);
  // Whether units gather one-sidedly: Note [When one-sided gathers may read].
  bool gathers_one_sided() const { return one_sided_; }

 private:
  Runtime(std::vector<Unit> units, ShardingStrategy strategy, std::shared_ptr<distributed::Communicator> shard_group,
          std::shared_ptr<distributed::Communicator> replicate_group, int world, int keep_last_gathered,
          bool reshard_after_forward);
  void register_hooks();
  void agree_on_one_sided_gathers();
  bool frees_after_forward(size_t unit) const;
  void check_optimizer_stepped();
  void gather(size_t unit, int direction);  // waits for the unit's parameters, prefetches its neighbour
  int64_t neighbour(size_t unit, int direction) const;
  void pre_backward(size_t unit);
  void on_gradient_ready(size_t unit, size_t index);
  void finalize();
  void drain() noexcept;
  [[noreturn]] void fail_unready();
  void forget_backward();  // clears one backward's launched reduce-scatters and ready flags
  // One-sided gathers only: a barrier of the shard group (Note [When one-sided gathers may read]).
  void shards_barrier(const char* why);

  std::vector<Unit> units_;
  ShardingStrategy strategy_;
  std::shared_ptr<distributed::Communicator> shard_group_, replicate_group_;
  int world_;
  bool one_sided_ = false;  // the units gather one-sidedly (Note [When one-sided gathers may read])
  size_t first_kept_ = 0;  // units from here on stay gathered after forward (Note [Which units stay gathered])
  int comm_track_ = 0;
  bool sync_ = true;
  bool reshard_after_forward_ = true;
  bool reshard_after_backward_ = true;
  // A "shards final" barrier was met and no shard can have been written since: the next
  // forward needs no barrier (Note [When one-sided gathers may read]).
  bool shards_final_ = false;
  int64_t barriers_ = 0, all_reduces_ = 0;

  // The step in progress.
  bool in_backward_ = false;  // a pre-backward hook queued finalize()
  bool reducing_ = false;     // the backward in progress reduces (sync() when it started)
  std::vector<size_t> launched_;  // units whose reduce-scatter was launched, in order
  std::vector<std::shared_ptr<distributed::Work>> reduce_works_;
  std::vector<int64_t> reduce_launch_us_;
  // Note [Did the optimizer step the shards?]: sharded_params()' versions after the last
  // synchronised backward (empty when there was none since the last check).
  std::vector<uint32_t> versions_after_backward_;
  bool ever_stepped_ = false;     // some shard changed after a synchronised backward
  int unstepped_backwards_ = 0;   // synchronised backwards so far that no step followed
};

}  // namespace loom::fsdp
