// DistributedDataParallel: one process per device, each with a full replica of the
// model and its own share of every batch; gradients are averaged across processes during
// backward, so every replica takes the same optimizer step. As
// torch.nn.parallel.DistributedDataParallel.
//
//   // launched as: loomrun --nproc_per_node 2 ./train
//   distributed::init_process_group("gloo");
//   auto model = nn::resnet18();
//   ddp::DistributedDataParallel ddp(model, distributed::default_group());
//   optim::SGD opt(ddp.parameters(), {.lr = 0.1});
//   for (auto& batch : loader) {                 // a DistributedSampler shards the data
//     Tensor loss = cross_entropy(ddp(batch.data), batch.target);
//     opt.zero_grad();
//     loss.backward();                           // returns with averaged gradients
//     opt.step();
//   }
//
// What it does (docs/ddp.md has the picture):
// - construction: checks that every rank built the same parameters (Note [Check shapes
//   before broadcasting]), broadcasts rank 0's parameters and buffers, and builds the
//   Reducer (buckets + gradient hooks; parallel/ddp/reducer.h);
// - forward: broadcasts rank 0's buffers first (broadcast_buffers, as PyTorch: BatchNorm
//   running statistics then come from rank 0), runs the module, and arms the reducer;
// - backward: the reducer all-reduces gradient buckets as they fill, overlapping the rest
//   of backward, and has averaged .grad()s in place when loss.backward() returns.
//
// It is an nn::Module whose one child is the wrapped module, registered as "module", so
// parameters(), train()/eval() and to() work on it as on any module and, exactly as in
// PyTorch, its state_dict() keys carry a "module." prefix. Checkpoint the wrapped module
// (ddp.module()) to get the plain keys, which load into an unwrapped model anywhere.
#pragma once

#include <memory>
#include <optional>

#include "nn/module.h"
#include "parallel/comm/communicator.h"
#include "parallel/ddp/debug.h"
#include "parallel/ddp/reducer.h"

namespace loom::ddp {

struct DDPOptions {
  // Later buckets' size in MiB (PyTorch's bucket_cap_mb). The first bucket is 1 MiB, or
  // bucket_cap_mb when that is smaller (Note [Bucket order]).
  double bucket_cap_mb = 25;
  // Broadcast rank 0's buffers before every forward.
  bool broadcast_buffers = true;
  // Walk the autograd graph at every forward to find parameters that will get no
  // gradient (see reducer.h); costs a graph walk per forward and one small all_reduce.
  bool find_unused_parameters = false;
  // Leave each .grad() as a view into its bucket instead of copying the averages back:
  // saves the copy and one gradient-sized buffer.
  bool gradient_as_bucket_view = false;
  // Default: LOOM_DISTRIBUTED_DEBUG (see parallel/ddp/debug.h).
  std::optional<DebugLevel> debug = std::nullopt;
};

class DistributedDataParallel : public nn::Module {
 public:
  // Collective: every rank of `process_group` constructs its DDP at the same point.
  DistributedDataParallel(std::shared_ptr<nn::Module> module, std::shared_ptr<distributed::Communicator> process_group,
                          DDPOptions options = {});

  Tensor forward(const Tensor& input) override;

  const std::shared_ptr<nn::Module>& module() const { return module_; }
  distributed::Communicator& process_group() const { return *comm_; }
  Reducer& reducer() const { return *reducer_; }
  const DDPOptions& options() const { return options_; }

  // RAII, as PyTorch's `with ddp.no_sync():` — forwards inside it are not synchronised,
  // so their backwards only accumulate .grad() locally; the first synchronised backward
  // after it averages the accumulated gradients. Gradient accumulation without paying
  // for communication on every micro-batch.
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& ddp) : ddp_(ddp), previous_(ddp.require_backward_grad_sync_) {
      ddp_.require_backward_grad_sync_ = false;
    }
    ~NoSync() { ddp_.require_backward_grad_sync_ = previous_; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*this); }

  // rank 0's buffers to every rank: what forward does first (broadcast_buffers). Public
  // for callers that run the wrapped module themselves and only use the reducer (a
  // pipeline stage's replicas; Note [A replicated stage synchronises once]).
  void sync_buffers();

 private:

  std::shared_ptr<nn::Module> module_;
  std::shared_ptr<distributed::Communicator> comm_;
  DDPOptions options_;
  std::shared_ptr<Announcer> announcer_;
  std::shared_ptr<Reducer> reducer_;
  std::vector<Tensor> buffers_;
  std::vector<std::string> buffer_names_;
  bool require_backward_grad_sync_ = true;
  // Whether the next forward broadcasts buffers: true after a synchronised training
  // forward, false after one under no_grad or no_sync (PyTorch's require_forward_param_sync).
  bool require_forward_param_sync_ = true;
  int64_t synchronized_forwards_ = 0;  // training forwards so far (Note [Kernel autotuning])
};

}  // namespace loom::ddp
