// PipelineStage::step: one step of this rank's stage under the schedule (Note [Stages as
// processes], pipeline_stage.h), in the order of its life: plan() the micro-batches and
// this rank's row of the schedule, check_arguments(), run the row's forwards and backwards
// (sending and receiving over the pipeline group), and finish() with one all-reduce that
// brings the loss to every rank, or the first failure to every rank (Note [A failed stage
// stops the pipeline]).
#include <algorithm>
#include <cmath>
#include <exception>
#include <optional>

#include "autograd/grad_mode.h"           // defines: GradMode
#include "core/error.h"
#include "core/factory.h"                 // defines: from_vector, empty, zeros
#include "core/trace.h"                   // defines: trace::Span (each action a span, as in one process)
#include "parallel/pipeline/microbatch_runner.h"  // defines: MicrobatchRunner, micro_batch_sizes, action_name
#include "parallel/pipeline/pipeline_stage.h"
#include "parallel/pipeline/schedule.h"   // defines: make_schedule, virtual_stage

namespace loom::parallel::pipeline {
namespace {

constexpr int kActivationTag = 0x50;  // forward: virtual stages' outputs to rank + 1
constexpr int kGradientTag = 0x51;    // backward: input gradients to rank - 1
constexpr int64_t kMaxDims = 8;       // of a per-sample shape in a header
constexpr int64_t kHeaderWords = 3 + kMaxDims;  // dtype, dims, channels-last, the dims
constexpr int64_t kAbortWords = 7;    // Note [A failed stage stops the pipeline]: no activation is int64 [7]
constexpr size_t kLookahead = 2;      // receives posted ahead on each tag

std::string what_of(const std::exception_ptr& error) {
  try { std::rethrow_exception(error); } catch (const std::exception& e) { return e.what(); } catch (...) {}
  return "an exception that is not a std::exception";
}

}  // namespace

// One step on this rank: Note [Stages as processes].
struct PipelineStage::Run {
  PipelineStage& ps;
  distributed::Communicator& comm;
  const int64_t S, V, C, rank;
  const int next, prev;  // the ranks activations go to and come from
  const Tensor& input;
  const Tensor& target;
  const double loss_scale;
  int64_t batch = 0;
  std::vector<int64_t> sizes;  // of the micro-batches
  std::vector<int64_t> backwards_done;  // [virtual stage]: backwards run so far this step
  std::vector<Action> order;   // this rank's row of the schedule
  std::optional<MicrobatchRunner> runner;  // this rank's virtual stages' work: made once the arguments are checked
  // The receives this rank's order makes, per tag (0: activations from `prev`,
  // 1: gradients from `next`), in order; posted[k] of them posted, taken[k] consumed.
  struct Expected {
    int64_t boundary = 0, m = 0;  // the output of virtual stage `boundary` for micro-batch m
    Tensor buffer;
    std::shared_ptr<distributed::Work> work;
  };
  std::vector<Expected> expected[2];
  size_t posted[2] = {0, 0}, taken[2] = {0, 0};
  std::vector<std::shared_ptr<distributed::Work>> sends;
  // Note [A failed stage stops the pipeline]: how this rank's step ended. The values travel
  // in the status all-reduce, so they are numbers every rank reads alike.
  enum class Failure : int { None = 0, Here = 1, StoppedByReceive = 2 };
  Failure failure = Failure::None;
  bool failed() const { return failure != Failure::None; }
  bool in_receive = false;
  std::exception_ptr error;
  std::optional<Action> failed_action;

  Run(PipelineStage& stage, const Tensor& in, const Tensor& tgt, double scale)
      : ps(stage), comm(*stage.group_), S(stage.stages_), V(stage.virtual_stages_), C(S * V), rank(stage.stage_),
        next(int((rank + 1) % S)), prev(int((rank + S - 1) % S)), input(in), target(tgt), loss_scale(scale) {}

  Tensor on_comm(const Tensor& t) const { return t.contiguous().to(comm.tensor_device()); }

  // Note [Activations keep their memory format between stages]
  // Communication moves one NCHW-contiguous buffer. A channels-last activation (what loom's
  // layers produce where NHWC kernels are fastest: core/cpu/activation_layout.h) made
  // contiguous would reach the next stage as NCHW, and its layers would then run other
  // kernels than one process runs on the same tensor -- other rounding, and a reorder
  // each way. So a boundary whose first output was channels-last travels as the NHWC
  // buffer itself (permute(0, 2, 3, 1) of it is contiguous) and is received as a
  // channels-last view of that buffer; the header says which, and the gradient over the
  // boundary travels in the same format. One process and the pipeline then compute alike.
  static bool is_channels_last(const Tensor& t) {
    return t.dim() == 4 && !t.is_contiguous() && t.is_contiguous(MemoryFormat::ChannelsLast);
  }
  Tensor on_wire(const Tensor& t, bool channels_last) const {
    if (!channels_last) return on_comm(t);
    return t.contiguous(MemoryFormat::ChannelsLast).permute({0, 2, 3, 1}).to(comm.tensor_device());
  }
  bool channels_last_at(int64_t boundary) const {
    auto it = ps.agreed_.find(boundary);
    return it != ps.agreed_.end() && it->second.channels_last;
  }

  // Batch size and schedule: what every rank must know to drain its receives on failure.
  void plan() {
    const Tensor& any = input.defined() ? input : target;
    LOOM_CHECK(any.defined() && any.dim() > 0 && any.size(0) > 0, "PipelineStage::step: stage ", rank, " got neither "
               "an input nor a target with a positive batch size; every stage needs the batch's size for its "
               "micro-batches (pass the batch on every rank)");
    batch = any.size(0);
    sizes = micro_batch_sizes(batch, ps.n_microbatches_);
    const auto M = static_cast<int64_t>(sizes.size());
    const Schedule schedule = make_schedule(ps.schedule_name_, S, M, V);
    for (const auto& row : schedule.ticks)
      if (row[size_t(rank)]) order.push_back(*row[size_t(rank)]);
    for (const Action& a : order) {
      const int64_t c = virtual_stage(rank, a.local_stage, S);
      if (a.pass == Pass::Forward && c > 0) expected[0].push_back({c - 1, a.micro_batch, {}, {}});
      if (a.pass == Pass::Backward && c < C - 1) expected[1].push_back({c, a.micro_batch, {}, {}});
    }
    backwards_done.assign(size_t(C), 0);
  }

  // Checks that need only this rank (after plan(), so a failure here drains).
  void check_arguments() {
    LOOM_CHECK(GradMode::is_enabled(), "PipelineStage::step trains: it runs forward and backward, so it needs grad "
               "mode on (it was called under NoGradGuard)");
    LOOM_CHECK(std::isfinite(loss_scale) && loss_scale > 0, "PipelineStage::step: loss_scale must be a positive "
               "finite number (GradScaler's scale), got ", loss_scale);
    if (ps.is_first()) {
      LOOM_CHECK(input.defined() && input.dim() > 0 && input.size(0) == batch, "PipelineStage::step: the first stage "
                 "needs the batch's input, got ", input.str(), " for a batch of ", batch);
    }
    if (ps.is_last()) {
      LOOM_CHECK(target.defined() && target.dim() > 0 && target.size(0) == batch, "PipelineStage::step: the last "
                 "stage needs the batch's target, got ", target.str(), " for a batch of ", batch);
    }
    std::vector<MicrobatchRunner::VirtualStage> virtual_stages(size_t(C), {nullptr, ps.device_});
    for (int64_t v = 0; v < V; ++v) {  // this rank's; the others run elsewhere
      const int64_t c = virtual_stage(rank, v, S);
      const auto& wrapper = ps.wrappers_[size_t(c)];
      virtual_stages[size_t(c)].module = wrapper ? wrapper.get() : ps.virtual_stage_layers_[size_t(c)].get();
    }
    runner.emplace(std::move(virtual_stages), S, ps.loss_fn_, batch, ps.n_microbatches_, ps.is_first() ? input : Tensor(),
                   ps.is_last() ? target : Tensor(), loss_scale, ps.checkpoint_);
  }

  // The dtype and shape of expected receive e on tag k, if known yet.
  // A gradient has its output's dtype and shape: the kept output's, or for a micro-batch
  // whose forward is recomputed in its backward (set_checkpoint), and so kept
  // nothing yet, the boundary's agreed ones (this rank sent their header).
  // (The shape is the buffer's on the wire: NHWC for a channels-last boundary.)
  std::optional<std::pair<DType, Shape>> spec_of(int k, const Expected& e) const {
    auto wire = [&](DType dtype, Shape shape) {
      if (channels_last_at(e.boundary)) shape = {shape[0], shape[2], shape[3], shape[1]};
      return std::make_pair(dtype, shape);
    };
    if (k == 1 && runner) {
      const Tensor& out = runner->kept_output(e.boundary, e.m);
      if (out.defined()) return wire(out.dtype(), out.shape());
      if (!runner->checkpointed(e.m)) return std::nullopt;
    }
    if (k == 1 && !runner) return std::nullopt;
    auto it = ps.agreed_.find(e.boundary);
    if (it == ps.agreed_.end()) return std::nullopt;
    Shape shape{sizes[size_t(e.m)]};
    shape.insert(shape.end(), it->second.sample.begin(), it->second.sample.end());
    return wire(it->second.dtype, shape);
  }

  void post_ahead(int k) {
    while (posted[k] < expected[k].size() && posted[k] < taken[k] + kLookahead) {
      Expected& e = expected[k][posted[k]];
      const auto spec = spec_of(k, e);
      if (!spec) break;
      e.buffer = empty(spec->second, TensorOptions(spec->first).device(comm.tensor_device()));
      e.work = comm.recv(e.buffer, k == 0 ? prev : next, k == 0 ? kActivationTag : kGradientTag);
      ++posted[k];
    }
  }

  // Note [Shapes are agreed once]: the header before the first activation over a boundary.
  void receive_header(int64_t boundary) {
    Tensor header = zeros({kHeaderWords}, TensorOptions(kInt64).device(comm.tensor_device()));
    trace::Span waiting("wait for activation", "pipeline wait");
    in_receive = true;
    comm.recv(header, prev, kActivationTag)->wait();
    in_receive = false;
    const std::vector<int64_t> h = header.tolist<int64_t>();
    LOOM_CHECK(h[0] >= 0 && h[0] <= int64_t(DType::BFloat16) && h[1] >= 0 && h[1] <= kMaxDims &&
                   (h[2] == 0 || (h[2] == 1 && h[1] == 3)),
               "PipelineStage: the shape header from rank ", prev, " is malformed; every rank must run the same loom");
    ps.agreed_[boundary] = {DType(h[0]), Shape(h.begin() + 3, h.begin() + 3 + h[1]), h[2] == 1};
  }

  void send_header(int64_t boundary, const Tensor& y) {
    LOOM_CHECK(y.dim() - 1 <= kMaxDims, "PipelineStage: a stage's output may have at most ", kMaxDims + 1,
               " dimensions, got ", y.str());
    std::vector<int64_t> h(size_t(kHeaderWords), 0);
    h[0] = int64_t(y.dtype());
    h[1] = y.dim() - 1;
    h[2] = is_channels_last(y) ? 1 : 0;
    for (int64_t d = 1; d < y.dim(); ++d) h[size_t(2 + d)] = y.size(d);
    sends.push_back(comm.send(on_comm(from_vector(h, {kHeaderWords})), next, kActivationTag));
    ps.agreed_[boundary] = {y.dtype(), Shape(y.shape().begin() + 1, y.shape().end()), h[2] == 1};
  }

  // The next receive on tag k (its boundary and micro-batch are this action's), on the
  // stage's device.
  Tensor take(int k) {
    Expected& e = expected[k].at(taken[k]);
    if (posted[k] == taken[k]) {
      if (k == 0 && !ps.agreed_.count(e.boundary)) receive_header(e.boundary);
      post_ahead(k);
      LOOM_CHECK(posted[k] > taken[k], "PipelineStage: internal error: no shape for the receive of micro-batch ", e.m);
    }
    {
      // Idle time inside the action's span: the bubble measurement subtracts it
      // (docs/pipeline.md; the in-process pipeline waits outside its spans).
      trace::Span waiting(k == 0 ? "wait for activation" : "wait for gradient", "pipeline wait");
      in_receive = true;
      e.work->wait();
      in_receive = false;
    }
    Tensor t = e.buffer;
    if (channels_last_at(e.boundary)) t = t.permute({0, 3, 1, 2});  // the NHWC buffer as [N, C, H, W]
    e.buffer = Tensor();
    e.work.reset();
    ++taken[k];
    post_ahead(k);
    return t.to(ps.device_);
  }

  // Virtual stage c's forward of micro-batch m: the runner's, as Pipeline::step's (Note
  // [One graph per virtual stage and micro-batch]); its input comes from rank `prev`, its
  // output goes to rank `next`.
  void forward(int64_t c, int64_t m) {
    Tensor y = runner->forward(c, m, c == 0 ? Tensor() : take(0));
    if (c == C - 1) return;  // the loss, kept by the runner
    auto it = ps.agreed_.find(c);
    if (it == ps.agreed_.end()) {
      send_header(c, y);
    } else {
      const Shape sample(y.shape().begin() + 1, y.shape().end());
      LOOM_CHECK(y.dtype() == it->second.dtype && sample == it->second.sample, virtual_stage_name(c, S, V),
                 "'s output is ",
                 y.str(), ", but the stages agreed at the first step on ", dtype_name(it->second.dtype),
                 " [micro-batch] + ", it->second.sample, " (Note [Shapes are agreed once]); a "
                 "stage's output must keep its shape and dtype from step to step");
    }
    sends.push_back(comm.send(on_wire(y, channels_last_at(c)), next, kActivationTag));
    post_ahead(0);
  }

  // Its backward: the output's gradient from rank `next`, the input's to rank `prev`.
  void backward(int64_t c, int64_t m) {
    if (ps.sync_.before_backward) {  // See Note [A replicated stage synchronises once]
      const bool last = ++backwards_done[size_t(c)] == static_cast<int64_t>(sizes.size());
      ps.sync_.before_backward(static_cast<size_t>(c / S), last);
    }
    Tensor grad = runner->backward(c, m, c == C - 1 ? Tensor() : take(1));
    if (c > 0) sends.push_back(comm.send(on_wire(grad, channels_last_at(c - 1)), prev, kGradientTag));
  }

  void fail(Failure kind, std::optional<Action> action) {
    failure = kind, error = std::current_exception(), failed_action = action;
  }

  // Note [A failed stage stops the pipeline]: (1) and (2). Nothing here is waited for.
  void stop_neighbours() {
    try {
      for (int k = 0; k < 2; ++k) {
        std::vector<int64_t> headers_owed;
        for (size_t i = posted[k]; i < expected[k].size(); ++i) {
          const Expected& e = expected[k][i];
          const auto spec = spec_of(k, e);
          const int tag = k == 0 ? kActivationTag : kGradientTag;
          if (!spec && k == 0 && std::find(headers_owed.begin(), headers_owed.end(), e.boundary) == headers_owed.end()) {
            headers_owed.push_back(e.boundary);  // its header comes first
            comm.recv(zeros({kHeaderWords}, TensorOptions(kInt64).device(comm.tensor_device())), prev, tag);
          }
          Tensor buffer = spec ? empty(spec->second, TensorOptions(spec->first).device(comm.tensor_device()))
                               : zeros({1}, TensorOptions(kFloat32).device(comm.tensor_device()));
          comm.recv(buffer, k == 0 ? prev : next, tag);
        }
      }
      Tensor abort = zeros({kAbortWords}, TensorOptions(kInt64).device(comm.tensor_device()));
      comm.send(abort, next, kActivationTag);
      comm.send(abort, prev, kGradientTag);
    } catch (const std::exception&) {
      // A broken communicator: the neighbours learn of it from their own transport.
    }
  }

  std::string where(const Action& a) const {
    const int64_t c = virtual_stage(rank, a.local_stage, S);
    return detail::str(a.pass == Pass::Forward ? "forward" : "backward", " of micro-batch ", a.micro_batch,
                       V > 1 ? detail::str(" on virtual stage ", c) : std::string());
  }

  StepResult go() {
    try {
      plan();
    } catch (...) {
      fail(Failure::Here, std::nullopt);
    }
    if (!failed()) {
      try {
        check_arguments();
      } catch (...) {
        fail(Failure::Here, std::nullopt);
      }
    }
    for (size_t i = 0; i < order.size() && !failed(); ++i) {
      const Action& a = order[i];
      try {
        trace::Span span(action_name(a, rank, S, V), "pipeline");
        in_receive = false;
        if (a.pass == Pass::Forward) forward(virtual_stage(rank, a.local_stage, S), a.micro_batch);
        else backward(virtual_stage(rank, a.local_stage, S), a.micro_batch);
      } catch (...) {
        fail(in_receive ? Failure::StoppedByReceive : Failure::Here, a);
      }
    }
    if (!failed()) {
      try {
        for (auto& w : sends) w->wait();
      } catch (...) {
        fail(Failure::StoppedByReceive, std::nullopt);
      }
    }
    if (failed()) stop_neighbours();
    return finish();
  }

  // Note [A failed stage stops the pipeline]: (3). One all-reduce of [loss, then per
  // rank: failure, micro-batch, pass, virtual stage].
  StepResult finish() {
    StepResult result;
    std::vector<double> status(size_t(1 + 4 * S), 0.0);
    if (!failed() && ps.is_last()) {
      try {  // an error here still reaches the all-reduce: the others are waiting in it
        status[0] = runner->loss().to(kFloat64).to(Device(DeviceType::CPU)).item<double>();
        result.output = runner->output();
      } catch (...) {
        fail(Failure::Here, std::nullopt);
      }
    }
    double* mine = &status[size_t(1 + 4 * rank)];
    mine[0] = double(int(failure));
    mine[1] = failed_action ? double(failed_action->micro_batch) : -1;
    mine[2] = failed_action ? double(int(failed_action->pass)) : -1;
    mine[3] = failed_action ? double(virtual_stage(rank, failed_action->local_stage, S)) : -1;
    Tensor reduced = distributed::to_communication_device(from_vector(status, {int64_t(status.size())}), comm);
    try {
      comm.all_reduce(reduced)->wait();
    } catch (...) {
      if (failed()) rethrow_own();  // the communicator is broken: what this rank knows
      ps.broken_ = "its status all-reduce failed";
      throw;
    }
    const std::vector<double> all = reduced.tolist<double>();
    // The first rank that failed by itself; else the first one stopped by a receive.
    int64_t origin = -1;
    for (Failure kind : {Failure::Here, Failure::StoppedByReceive}) {
      for (int64_t r = 0; r < S && origin < 0; ++r)
        if (all[size_t(1 + 4 * r)] == double(int(kind))) origin = r;
      if (origin >= 0) break;
    }
    if (origin >= 0) {
      if (origin == rank) rethrow_own();
      const double* theirs = &all[size_t(1 + 4 * origin)];
      std::string what = "its step";
      if (theirs[1] >= 0)
        what = detail::str("the ", theirs[2] == 0 ? "forward" : "backward", " of micro-batch ", int64_t(theirs[1]),
                           V > 1 ? detail::str(" on virtual stage ", int64_t(theirs[3])) : std::string());
      ps.broken_ = detail::str("stage ", origin, " failed");
      LOOM_FAIL("PipelineStage: stage ", origin, " (rank ", origin, " of the pipeline group) failed in ", what,
                "; stage ", rank, " stopped its step (the error is on rank ", origin, ")");
    }
    result.loss = from_vector(std::vector<double>{all[0]}, {});
    return result;
  }

  [[noreturn]] void rethrow_own() {
    const std::string pass = failed_action ? where(*failed_action)
                                           : failure == Failure::StoppedByReceive ? "waiting for its sends" : "set-up or the loss sum of its step";
    ps.broken_ = detail::str("stage ", rank, " failed");
    LOOM_FAIL("PipelineStage: stage ", rank, " (rank ", rank, " of the pipeline group, ", ps.device_, ") failed in the ",
              pass, ": ", what_of(error));
  }
};

PipelineStage::StepResult PipelineStage::step(const Tensor& input, const Tensor& target, double loss_scale) {
  LOOM_CHECK(broken_.empty(), "PipelineStage: an earlier step failed (", broken_, "), so the pipeline group's messages "
             "are out of step; recreate the group and its stages to go on");
  Run run(*this, input, target, loss_scale);
  StepResult result = run.go();
  if (run.runner) run.runner->check_recomputed_exactly();
  if (sync_.after_step) sync_.after_step();
  return result;
}

}  // namespace loom::parallel::pipeline
