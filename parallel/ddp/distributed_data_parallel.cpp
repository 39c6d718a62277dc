#include "parallel/ddp/distributed_data_parallel.h"

#include "core/cpu/kernel_benchmark.h"          // defines: backends::cpu::benchmark
#include "parallel/kernel_choice_agreement.h"  // defines: agree_on_kernel_choices

#include <algorithm>
#include <cstdio>

#include "autograd/grad_mode.h"          // defines: GradMode
#include "core/error.h"
#include "core/trace.h"                  // defines: trace::Span
#include "parallel/ddp/replica_sync.h"   // defines: verify_same_shapes, broadcast_coalesced

namespace loom::ddp {

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> module,
                                                 std::shared_ptr<distributed::Communicator> process_group,
                                                 DDPOptions options)
    : Module("DistributedDataParallel"),
      module_(std::move(module)),
      comm_(std::move(process_group)),
      options_(options) {
  LOOM_CHECK(module_ != nullptr, "DistributedDataParallel: the module is null");
  LOOM_CHECK(comm_ != nullptr, "DistributedDataParallel: the process group is null; call "
             "distributed::init_process_group() and pass distributed::default_group()");
  LOOM_CHECK(options_.bucket_cap_mb > 0, "DistributedDataParallel: bucket_cap_mb must be positive, got ",
             options_.bucket_cap_mb);
  register_module("module", module_);
  announcer_ = std::make_shared<Announcer>(*comm_, options_.debug.value_or(debug_level_from_env()));

  // Every parameter (frozen ones too) and buffer starts as rank 0's; only the parameters
  // that require grad are reduced.
  std::vector<Tensor> state, params;
  std::vector<std::string> state_names, names;
  for (const auto& [name, p] : module_->named_parameters()) {
    state.push_back(p);
    state_names.push_back(name);
    if (!p.requires_grad()) continue;
    params.push_back(p);
    names.push_back(name);
  }
  LOOM_CHECK(!params.empty(), "DistributedDataParallel: the module (", module_->type_name(), ") has no parameter "
             "that requires grad, so there is nothing to synchronise; DDP is not needed for it");
  verify_same_shapes(*comm_, state, state_names, "parameter");  // Note [Check shapes before broadcasting]
  for (const auto& [name, b] : module_->named_buffers()) {
    buffers_.push_back(b);
    buffer_names_.push_back(name);
  }
  verify_same_shapes(*comm_, buffers_, buffer_names_, "buffer");
  state.insert(state.end(), buffers_.begin(), buffers_.end());
  state_names.insert(state_names.end(), buffer_names_.begin(), buffer_names_.end());
  broadcast_coalesced(*comm_, state, /*root=*/0, [&](const Tensor& flat) {
    return announcer_->announce(CollectiveCall{.purpose = CollectivePurpose::ParameterBroadcast}, flat);
  }, state_names);

  ReducerOptions reducer_options;
  reducer_options.bucket_cap_bytes = static_cast<size_t>(options_.bucket_cap_mb * (1 << 20));
  reducer_options.first_bucket_bytes = std::min(kDefaultFirstBucketBytes, reducer_options.bucket_cap_bytes);
  reducer_options.last_bucket_bytes = reducer_options.first_bucket_bytes;
  reducer_options.find_unused_parameters = options_.find_unused_parameters;
  reducer_options.gradient_as_bucket_view = options_.gradient_as_bucket_view;
  reducer_ = Reducer::create(std::move(params), std::move(names), comm_, reducer_options, announcer_);

  if (announcer_->level() != DebugLevel::Off && comm_->rank() == 0) {
    std::fprintf(stderr, "%s", reducer_->layout().c_str());
    std::fflush(stderr);
  }
}

void DistributedDataParallel::sync_buffers() {
  trace::Span span("broadcast buffers", "ddp");
  const int64_t iteration = reducer_->iteration();
  broadcast_coalesced(*comm_, buffers_, /*root=*/0, [&](const Tensor& flat) {
    return announcer_->announce(CollectiveCall{.iteration = iteration, .purpose = CollectivePurpose::BufferBroadcast},
                                flat);
  }, buffer_names_);
}

Tensor DistributedDataParallel::forward(const Tensor& input) {
  // As PyTorch: buffers are broadcast if the previous forward was a synchronised training
  // one (so also by the first forward of an evaluation right after training).
  if (options_.broadcast_buffers && require_forward_param_sync_ && !buffers_.empty()) sync_buffers();
  const bool sync = GradMode::is_enabled() && require_backward_grad_sync_;
  // Note [Kernel autotuning] (core/cpu/kernel_benchmark.h): at the second training
  // forward every rank has met a whole step's shapes; from here on all use rank 0's choices.
  if (sync && ++synchronized_forwards_ == 2 && backends::cpu::benchmark()) distributed::agree_on_kernel_choices(*comm_);
  Tensor output = (*module_)(input);  // module(x): its forward hooks run, as PyTorch's self.module(*inputs)
  if (sync) {
    reducer_->prepare_for_backward(options_.find_unused_parameters ? std::vector<Tensor>{output}
                                                                   : std::vector<Tensor>{});
  } else {
    reducer_->prepare_for_local_backward();
  }
  require_forward_param_sync_ = sync;
  return output;
}

}  // namespace loom::ddp
