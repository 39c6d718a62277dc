#include "parallel/ddp/reducer.h"

#include <chrono>
#include <cstdio>
#include <unordered_map>
#include <unordered_set>

#include "autograd/engine.h"     // defines: queue_callback
#include "autograd/grad_mode.h"  // defines: NoGradGuard
#include "autograd/ops.h"        // defines: wrap_scalar
#include "autograd/variable.h"   // defines: AutogradMeta (a parameter's gradient accumulator)
#include "core/error.h"
#include "core/kernels.h"        // defines: binary_kernel
#include "core/trace.h"          // defines: trace::record, trace::now_us

namespace loom::ddp {

using distributed::Communicator;
using distributed::ReduceOp;

// Note [Divide on the way in]
// Each gradient is divided by the world size as it is copied into its bucket, and the
// bucket is all-reduced with Sum; the alternative is to copy and all_reduce with Avg.
// The copy reads and writes every element anyway, so the division rides along for free
// on the backward thread, while Avg would add a pass over the whole bucket on the
// communicator's thread, after the data has arrived, where it delays the bucket's
// completion. (PyTorch also divides on the way in.) With gradient_as_bucket_view a
// gradient that already lives in its slot is divided in place. Like PyTorch's reducer it
// multiplies by 1/world (exact for powers of two, within an ulp otherwise); the scalar
// is a stride-0 operand, which the CPU loop streams at copy speed (Note [Broadcast
// scalars in the inner loop], core/cpu/loops.h).
void copy_divided(Tensor dst, const Tensor& src, int world) {
  if (world == 1) {
    if (!src.is_same(dst)) copy_kernel(dst.device())(src, dst, /*non_blocking=*/false);
    return;
  }
  Tensor factor = wrap_scalar(1.0 / static_cast<double>(world), src).expand(src.shape());
  binary_kernel(dst.device())(BinaryOp::Mul, src, factor, 1.0, dst);
}

std::shared_ptr<Reducer> Reducer::create(std::vector<Tensor> params, std::vector<std::string> names,
                                         std::shared_ptr<Communicator> comm, ReducerOptions options,
                                         std::shared_ptr<Announcer> announcer) {
  std::shared_ptr<Reducer> reducer(
      new Reducer(std::move(params), std::move(names), std::move(comm), options, std::move(announcer)));
  reducer->register_hooks();  // the hooks hold a weak_ptr, which needs the shared_ptr to exist
  return reducer;
}

Reducer::Reducer(std::vector<Tensor> params, std::vector<std::string> names, std::shared_ptr<Communicator> comm,
                 ReducerOptions options, std::shared_ptr<Announcer> announcer)
    : params_(std::move(params)),
      names_(std::move(names)),
      comm_(std::move(comm)),
      options_(options),
      announcer_(std::move(announcer)) {
  LOOM_CHECK(comm_ != nullptr, "Reducer: the communicator is null");
  LOOM_CHECK(!params_.empty(), "Reducer: no parameters to reduce; DistributedDataParallel needs a module with at "
             "least one parameter that requires grad");
  LOOM_CHECK(names_.size() == params_.size(), "Reducer: got ", params_.size(), " parameters but ", names_.size(),
             " names");
  for (size_t i = 0; i < params_.size(); ++i) {
    LOOM_CHECK(params_[i].requires_grad() && params_[i].is_leaf(), "Reducer: parameter ", i, " (\"", names_[i],
               "\") must be a leaf that requires grad, got ", params_[i].str());
  }
  if (!announcer_) announcer_ = std::make_shared<Announcer>(*comm_, DebugLevel::Off);
  comm_track_ = trace::track(detail::str("comm (rank ", comm_->rank(), ")"));
  build_buckets();
  start_iteration();
}

Reducer::~Reducer() { drain(); }

void Reducer::build_buckets() {
  std::vector<ParameterInfo> infos;
  for (const Tensor& p : params_) infos.push_back({p.numel(), p.dtype(), p.device()});
  auto assignment = compute_bucket_assignment_by_size(infos, {options_.first_bucket_bytes, options_.bucket_cap_bytes});
  assignment = split_last_bucket(std::move(assignment), infos, options_.last_bucket_bytes);  // Note [A small last bucket]
  slot_of_.resize(params_.size());
  for (auto& indices : assignment) {
    Bucket bucket;
    int64_t total = 0;
    for (size_t i : indices) {
      bucket.offsets.push_back(total);
      total += params_[i].numel();
    }
    const Tensor& first = params_[indices.front()];
    // In the communicator's symmetric memory where it has some: Note [Symmetric memory].
    bucket.flat = comm_->zeros_symmetric({total}, TensorOptions(first.dtype()).device(first.device()));
    for (size_t k = 0; k < indices.size(); ++k) {
      const Tensor& p = params_[indices[k]];
      bucket.views.push_back(bucket.flat.narrow(0, bucket.offsets[k], p.numel()).view(p.shape()));
      slot_of_[indices[k]] = {buckets_.size(), k};
    }
    bucket.params = std::move(indices);
    buckets_.push_back(std::move(bucket));
  }
}

void Reducer::register_hooks() {
  std::weak_ptr<Reducer> weak = weak_from_this();
  for (size_t i = 0; i < params_.size(); ++i) {
    // A parameter may outlive its reducer (a module wrapped by DDP twice); the hook then
    // finds the reducer gone and does nothing.
    params_[i].register_post_accumulate_grad_hook([weak, i](const Tensor&) {
      if (auto reducer = weak.lock()) reducer->on_gradient_ready(i);
    });
  }
}

void Reducer::start_iteration() {
  expect_hooks_ = false;
  finalize_queued_ = false;
  ready_.assign(params_.size(), 0);
  used_.assign(params_.size(), 0);
  unused_.clear();
  pending_.clear();
  for (const Bucket& b : buckets_) pending_.push_back(b.params.size());
  next_to_launch_ = 0;
  works_.assign(buckets_.size(), nullptr);
  announcements_.assign(buckets_.size(), Announcement());
}

void Reducer::prepare_for_local_backward() {
  if (!finalize_queued_) expect_hooks_ = false;
}

void Reducer::prepare_for_backward(const std::vector<Tensor>& outputs) {
  if (finalize_queued_) {
    // A backward started reducing and never reached its end: it threw. Its buckets may be
    // in flight, and the ranks are probably no longer issuing the same collectives.
    drain();
    start_iteration();
    LOOM_FAIL("DistributedDataParallel: the previous backward started reducing gradients but did not finish (an "
              "exception ended it). The ranks may now disagree about which collectives come next, so training "
              "cannot safely continue; fix the first error and restart every rank");
  }
  start_iteration();
  expect_hooks_ = true;
  ++iteration_;
  if (options_.find_unused_parameters) unused_ = find_unused_parameters(outputs, params_);
}

// Note [When the reducer finalizes]
// PyTorch's reducer queues a final callback with the autograd engine from the first
// gradient hook; loom's engine offers the same (autograd::queue_callback, Note [Final
// callbacks]). So finalize() runs on the backward thread right after the last gradient
// is computed, before loss.backward() returns, and the training loop is the
// single-process one, unchanged: no extra call to forget before optimizer.step(). It is
// also the one moment that knows backward is over, so a parameter that got no gradient
// is reported there, by name, rather than by a hang or at the next forward.
void Reducer::on_gradient_ready(size_t index) {
  if (!expect_hooks_) return;  // not a synchronised backward: no_sync(), or no DDP forward
  const int64_t now = trace::now_us();
  if (!finalize_queued_) {
    finalize_queued_ = true;
    timeline_ = BackwardTimeline{};
    timeline_.first_gradient_us = now;
    timeline_.launch_us.assign(buckets_.size(), -1);
    timeline_.complete_us.assign(buckets_.size(), -1);
    std::weak_ptr<Reducer> weak = weak_from_this();
    autograd::queue_callback([weak] {
      if (auto reducer = weak.lock()) reducer->finalize();
    });
    // Unused parameters get no hook: mark them now so their buckets are not held up.
    for (size_t unused : unused_) mark_ready(unused, /*unused=*/true);
  }
  timeline_.last_gradient_us = now;
  LOOM_CHECK(!ready_[index], "DistributedDataParallel: parameter \"", names_[index], "\" received its gradient twice "
             "in one backward. If find_unused_parameters=true, the graph walk at forward time found it unused, yet "
             "a gradient arrived: was it used outside the forward of the DDP-wrapped module?");
  used_[index] = 1;
  mark_ready(index, /*unused=*/false);
}

void Reducer::mark_ready(size_t index, bool unused) {
  const auto [b, k] = slot_of_[index];
  const Tensor& view = buckets_[b].views[k];
  const Tensor grad = params_[index].grad();
  NoGradGuard no_grad;
  if (unused || !grad.defined()) {
    Tensor(view).zero_();  // an unused parameter contributes zeros
  } else {
    // See Note [Divide on the way in]. In place when .grad() already is the slot
    // (gradient_as_bucket_view after the first step, unless zero_grad dropped it).
    const bool in_slot = grad.storage() == view.storage() && grad.storage_offset() == view.storage_offset();
    copy_divided(view, grad, comm_->size());
    if (options_.gradient_as_bucket_view && !in_slot) params_[index].set_grad(view);
  }
  ready_[index] = 1;
  if (--pending_[b] == 0) launch_ready_buckets();
}

// Note [Buckets launch in order]
// A bucket's all_reduce is launched when it is full *and* every bucket before it has
// been launched; a bucket that fills early waits for its predecessors. Collectives are
// matched across ranks by their order, so launching in readiness order would be correct
// only if every rank saw the same readiness order; when one does not (a data-dependent
// branch, different timing of hooks), two equal-sized buckets would be summed with each
// other, silently. Bucket order is the same on every rank by construction. With
// loom's deterministic engine the readiness order follows the bucket order almost
// exactly anyway (both are reverse registration order), so waiting costs little. PyTorch
// makes the same choice. Completion order is the communicator's (FIFO for Gloo).
void Reducer::launch_ready_buckets() {
  while (next_to_launch_ < buckets_.size() && pending_[next_to_launch_] == 0) {
    const size_t b = next_to_launch_++;
    const Bucket& bucket = buckets_[b];
    CollectiveCall call{.iteration = iteration_, .purpose = CollectivePurpose::BucketAllReduce,
                        .bucket = static_cast<int64_t>(b), .num_params = static_cast<int64_t>(bucket.params.size()),
                        .first_param = static_cast<int64_t>(bucket.params.front()),
                        .last_param = static_cast<int64_t>(bucket.params.back())};
    announcements_[b] = announcer_->announce(call, bucket.flat);
    timeline_.launch_us[b] = trace::now_us();
    works_[b] = comm_->all_reduce(bucket.flat, ReduceOp::Sum);
  }
}

// Note [When did a bucket's all_reduce finish]
// For host backends (gloo) wait() returns once the operation finished, so completed_at()
// is known. For NCCL, wait() only orders the caller's stream after the operation (Note
// [NCCL streams]) and returns at once; completed_at() means something only once
// is_completed() says so, and is then when the host *noticed* (nccl_work.h). Asking
// is_completed() here does not block; a bucket still running on the GPU gets -1, and
// the trace draws no span for it rather than a made-up one. Blocking the host to learn
// the time would serialise it with the GPU at every step.
int64_t completion_us(const distributed::Work& work) {
  if (!work.is_completed()) return -1;
  return std::chrono::duration_cast<std::chrono::microseconds>(work.completed_at().time_since_epoch()).count();
}

void Reducer::finalize() {
  timeline_.finalize_begin_us = trace::now_us();
  try {
    if (next_to_launch_ < buckets_.size()) fail_unready();
    wait_and_write_back();
  } catch (...) {
    drain();
    start_iteration();
    throw;
  }
  start_iteration();
  timeline_.finalize_end_us = trace::now_us();
  trace_backward();
}

[[noreturn]] void Reducer::fail_unready() {
  std::string missing, indices;
  size_t count = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (ready_[i]) continue;
    if (count < 20) {
      missing += "\n  " + names_[i];
      indices += (count ? ", " : "") + std::to_string(i);
    }
    ++count;
  }
  if (count > 20) missing += detail::str("\n  ... and ", count - 20, " more");
  LOOM_FAIL("DistributedDataParallel: backward finished, but ", count, " parameter", count == 1 ? "" : "s",
            " of the wrapped module received no gradient on rank ", comm_->rank(), ":", missing,
            "\n(registration indices ", indices, "). Their buckets could not be all-reduced, so the gradients of "
            "this step were not averaged. This happens when part of the module does not contribute to the loss (a "
            "branch skipped by control flow, an output left out of the loss). Pass find_unused_parameters=true to "
            "DistributedDataParallel to let DDP find such parameters at every forward, or make every forward output "
            "take part in the loss. LOOM_DISTRIBUTED_DEBUG=info prints which bucket holds each parameter");
}

void Reducer::wait_and_write_back() {
  for (size_t b = 0; b < buckets_.size(); ++b) {
    announcements_[b].check(names_);  // detail mode: every rank means the same bucket
    works_[b]->wait();
    timeline_.complete_us[b] = completion_us(*works_[b]);
  }
  // find_unused_parameters: how many ranks used each parameter. One no rank used keeps its
  // .grad() untouched (often undefined), as PyTorch, so that the optimizer skips it.
  std::vector<int64_t> users;
  if (options_.find_unused_parameters) {
    std::vector<int64_t> mine(used_.begin(), used_.end());
    // See Note [Metadata tensors travel on the communicator's device] (communicator.h).
    Tensor counts = distributed::to_communication_device(
        from_vector<int64_t>(mine, {static_cast<int64_t>(mine.size())}), *comm_);
    Announcement announced = announcer_->announce(
        CollectiveCall{.iteration = iteration_, .purpose = CollectivePurpose::UsedParameters}, counts);
    auto work = comm_->all_reduce(counts, ReduceOp::Sum);
    announced.check(names_);
    work->wait();
    users = counts.tolist<int64_t>();
  }
  NoGradGuard no_grad;
  for (const Bucket& bucket : buckets_) {
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      const size_t i = bucket.params[k];
      if (!users.empty() && users[i] == 0) continue;
      const Tensor& param = params_[i];
      if (options_.gradient_as_bucket_view) {
        param.set_grad(bucket.views[k]);  // no copy: .grad() is the bucket's slot
        continue;
      }
      Tensor grad = param.grad();
      if (grad.defined()) grad.copy_(bucket.views[k]);
      else param.set_grad(bucket.views[k].clone());  // unused here, used elsewhere
    }
  }
}

void Reducer::drain() noexcept {
  for (const auto& work : works_) {
    if (!work) continue;
    try {
      work->wait();
    } catch (...) {  // the error was (or will be) reported by whoever waited first
    }
  }
}

void Reducer::trace_backward() const {
  if (!trace::enabled()) return;
  const int thread = trace::thread_track();
  trace::record("gradient hooks", "ddp", thread, timeline_.first_gradient_us,
                timeline_.last_gradient_us - timeline_.first_gradient_us);
  trace::record("wait for buckets", "ddp", thread, timeline_.finalize_begin_us,
                timeline_.finalize_end_us - timeline_.finalize_begin_us);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (timeline_.complete_us[b] < 0) continue;  // See Note [When did a bucket's all_reduce finish]
    trace::record(detail::str("all_reduce bucket ", b), "ddp", comm_track_, timeline_.launch_us[b],
                  timeline_.complete_us[b] - timeline_.launch_us[b],
                  detail::str("\"bucket\": ", b, ", \"params\": ", buckets_[b].params.size(), ", \"bytes\": ",
                              buckets_[b].flat.nbytes()));
  }
}

std::string Reducer::layout() const {
  size_t total = 0;
  for (const Bucket& b : buckets_) total += b.flat.nbytes();
  auto mib = [](size_t bytes) { return static_cast<double>(bytes) / (1 << 20); };
  char line[512];
  std::snprintf(line, sizeof(line),
                "DDP bucket layout (rank %d of %d): %zu parameters, %.2f MiB in %zu buckets "
                "(first bucket cap %.2f MiB, then %.2f MiB, the last at most %.2f MiB)\n  bucket  params         bytes  "
                "dtype    "
                "first parameter -> last parameter\n",
                comm_->rank(), comm_->size(), params_.size(), mib(total), buckets_.size(),
                mib(options_.first_bucket_bytes), mib(options_.bucket_cap_bytes), mib(options_.last_bucket_bytes));
  std::string out = line;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const Bucket& bucket = buckets_[b];
    std::snprintf(line, sizeof(line), "  %6zu  %6zu  %12zu  %-7s  %s -> %s\n", b, bucket.params.size(),
                  bucket.flat.nbytes(), dtype_name(bucket.flat.dtype()), names_[bucket.params.front()].c_str(),
                  names_[bucket.params.back()].c_str());
    out += line;
  }
  return out;
}

std::vector<size_t> find_unused_parameters(const std::vector<Tensor>& outputs, const std::vector<Tensor>& params) {
  // Each parameter's accumulator, if the graph holds one (a leaf's AccumulateGrad is
  // created by its first use in a recorded op and lives as long as the graph does).
  std::unordered_map<const Node*, size_t> accumulator_of;
  std::vector<std::shared_ptr<Node>> alive;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& meta = params[i].unsafe_impl()->autograd;
    if (!meta) continue;
    std::shared_ptr<Node> accumulator;
    {
      std::lock_guard<std::mutex> lock(meta->mutex);
      accumulator = meta->grad_accumulator.lock();
    }
    if (!accumulator) continue;
    accumulator_of[accumulator.get()] = i;
    alive.push_back(std::move(accumulator));
  }
  std::vector<char> used(params.size(), 0);
  std::unordered_set<const Node*> seen;
  std::vector<std::shared_ptr<Node>> stack;
  for (const Tensor& out : outputs) {
    Edge edge = gradient_edge(out);
    if (edge.valid() && seen.insert(edge.function.get()).second) stack.push_back(edge.function);
  }
  while (!stack.empty()) {
    std::shared_ptr<Node> node = std::move(stack.back());
    stack.pop_back();
    if (auto it = accumulator_of.find(node.get()); it != accumulator_of.end()) used[it->second] = 1;
    for (const Edge& next : node->next_edges())
      if (next.valid() && seen.insert(next.function.get()).second) stack.push_back(next.function);
  }
  std::vector<size_t> unused;
  for (size_t i = 0; i < params.size(); ++i)
    if (!used[i]) unused.push_back(i);
  return unused;
}

}  // namespace loom::ddp
