#include "parallel/fsdp/runtime.h"

#include <algorithm>
#include <cctype>

#include "autograd/engine.h"       // defines: queue_callback
#include "autograd/grad_mode.h"    // defines: GradMode, NoGradGuard
#include "core/error.h"
#include "core/factory.h"          // defines: from_vector
#include "core/shape_only.h"       // defines: shape_only (Note [Shape-only steps wait for each reduce-scatter])
#include "core/trace.h"            // defines: trace::Span, trace::record, trace::track
#include "parallel/ddp/reducer.h"  // defines: completion_us

namespace loom::fsdp {

using distributed::ReduceOp;

const char* strategy_name(ShardingStrategy strategy) {
  switch (strategy) {
    case ShardingStrategy::FULL_SHARD: return "FULL_SHARD";
    case ShardingStrategy::SHARD_GRAD_OP: return "SHARD_GRAD_OP";
    case ShardingStrategy::NO_SHARD: return "NO_SHARD";
    case ShardingStrategy::HYBRID_SHARD: return "HYBRID_SHARD";
  }
  return "?";
}

ShardingStrategy parse_sharding_strategy(const std::string& name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  if (lower == "full_shard") return ShardingStrategy::FULL_SHARD;
  if (lower == "shard_grad_op") return ShardingStrategy::SHARD_GRAD_OP;
  if (lower == "no_shard") return ShardingStrategy::NO_SHARD;
  if (lower == "hybrid_shard") return ShardingStrategy::HYBRID_SHARD;
  LOOM_FAIL("unknown sharding strategy \"", name, "\"; expected full_shard, shard_grad_op, no_shard or hybrid_shard");
}

std::shared_ptr<Runtime> Runtime::create(std::vector<Unit> units, ShardingStrategy strategy,
                                         std::shared_ptr<distributed::Communicator> shard_group,
                                         std::shared_ptr<distributed::Communicator> replicate_group, int world,
                                         int keep_last_gathered, bool reshard_after_forward) {
  std::shared_ptr<Runtime> runtime(new Runtime(std::move(units), strategy, std::move(shard_group),
                                               std::move(replicate_group), world, keep_last_gathered,
                                               reshard_after_forward));
  runtime->register_hooks();  // the hooks hold a weak_ptr, which needs the shared_ptr to exist
  runtime->agree_on_one_sided_gathers();
  return runtime;
}

Runtime::Runtime(std::vector<Unit> units, ShardingStrategy strategy,
                 std::shared_ptr<distributed::Communicator> shard_group,
                 std::shared_ptr<distributed::Communicator> replicate_group, int world, int keep_last_gathered,
                 bool reshard_after_forward)
    : units_(std::move(units)),
      strategy_(strategy),
      shard_group_(std::move(shard_group)),
      replicate_group_(std::move(replicate_group)),
      world_(world),
      reshard_after_forward_(reshard_after_forward && (strategy == ShardingStrategy::FULL_SHARD ||
                                                       strategy == ShardingStrategy::HYBRID_SHARD)) {
  // The first of the last `keep_last_gathered` units with parameters.
  first_kept_ = units_.size();
  for (int kept = 0; kept < keep_last_gathered && first_kept_ > 0;) {
    const int64_t before = neighbour(first_kept_, -1);
    if (before < 0) break;
    first_kept_ = static_cast<size_t>(before);
    ++kept;
  }
  const auto& any = shard_group_ ? shard_group_ : replicate_group_;
  comm_track_ = trace::track(detail::str("comm (rank ", any ? any->rank() : 0, ")"));
}

Runtime::~Runtime() { drain(); }

// Note [When one-sided gathers may read]
// With its shards in symmetric memory (Note [Shards in symmetric memory], flat_param.cpp)
// a rank can gather a unit by copying every rank's shard, without the other ranks taking
// part (Note [One-sided all_gather], communicator.h). That is what lets the ranks run
// their forward and backward without meeting at every unit: a collective all-gather
// makes each unit wait for the slowest rank to reach it, twice a step per unit, and on a
// machine whose cores run at uneven speeds every one of those waits is lost time. The
// price is a protocol that says when a shard may be read. A rank writes its shards only
// in an optimizer step or a checkpoint load, so:
// - before a rank reads (at the start of a forward), the ranks meet at a barrier: every
//   earlier step and load is over on every rank. Only the first forward after a point
//   where a write may come next needs it (construction, a synchronised backward, a
//   forward without grad, a checkpoint gather): a backward that does not reduce
//   (no_sync(), set_sync(false)) promises that no step or load comes before the next
//   synchronised backward, so the forwards after it (gradient accumulation, a pipeline's
//   micro-batches: Note [FSDP under a pipeline]) read shards that are still the ones
//   the barrier saw;
// - before a rank writes again, every rank must have finished reading. After a
//   synchronised backward this needs nothing more: a rank steps after its backward's
//   reduce-scatters have finished, and the last of them (the first unit's) can finish
//   only once every peer joined it, which a peer's training thread issues after that
//   unit's backward, so after its last gather (the gathers run on that thread, in
//   order), including those of the no_sync() backwards and forwards before it. A
//   forward without grad has no reduce-scatter after it, so it ends with a second
//   barrier.
// Every rank decides the same way: they agree at construction (an all_reduce of "are all
// my shards symmetric"), so a rank without symmetric memory makes all of them use
// collective all-gathers instead.
void Runtime::agree_on_one_sided_gathers() {
  if (!shard_group_ || shard_group_->size() == 1) return;
  bool symmetric = true;
  for (const Unit& unit : units_)
    if (unit.flat) symmetric = symmetric && shard_group_->is_symmetric(unit.flat->shard());
  Tensor vote = distributed::to_communication_device(from_vector<int32_t>({symmetric ? 1 : 0}, {1}), *shard_group_);
  shard_group_->all_reduce(vote, ReduceOp::Min)->wait();
  one_sided_ = vote.tolist<int32_t>()[0] == 1;
  for (Unit& unit : units_)
    if (unit.flat) unit.flat->use_one_sided_gathers(one_sided_);
}

void Runtime::shards_barrier(const char* why) {
  if (!one_sided_) return;
  trace::Span span(why, "fsdp");
  ++barriers_;
  shard_group_->barrier()->wait();
}

Runtime::CommCounts Runtime::comm_counts() const {
  CommCounts counts{.all_reduces = all_reduces_, .barriers = barriers_};
  for (const Unit& unit : units_) {
    if (!unit.flat) continue;
    counts.all_gathers += unit.flat->gathers();
    counts.reduce_scatters += unit.flat->reduce_scatters();
  }
  return counts;
}

void Runtime::register_hooks() {
  std::weak_ptr<Runtime> weak = weak_from_this();
  for (size_t u = 0; u < units_.size(); ++u) {
    if (!units_[u].flat) continue;
    const auto& params = units_[u].flat->params();
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].register_post_accumulate_grad_hook([weak, u, i](const Tensor&) {
        if (auto runtime = weak.lock()) runtime->on_gradient_ready(u, i);
      });
    }
  }
}

std::vector<Tensor> Runtime::shards() const {
  std::vector<Tensor> out;
  for (const Unit& unit : units_)
    if (unit.flat) out.push_back(unit.flat->shard());
  return out;
}

std::vector<Tensor> Runtime::sharded_params() const {
  std::vector<Tensor> out;
  for (const Unit& unit : units_)
    if (unit.flat)
      for (const Tensor& p : unit.flat->sharded_params()) out.push_back(p);
  return out;
}

// Note [Which units stay gathered]
// FULL_SHARD frees each unit after its forward so that only the units in flight hold
// their full parameters; the backward gathers them again. For the last units that buys
// nothing: backward starts with them, so the memory comes back at once, and their
// re-gather cannot hide behind other work (a unit's all-gather is prefetched while the
// unit after it computes its backward, and nothing comes after the last). So the last
// unit stays gathered (PyTorch's root does), and FSDPOptions::keep_last_gathered can
// keep more: torchtitan keeps the last transformer block, whose re-gather would wait
// only on the tiny output layer's backward. In ResNet18 that block is the last
// BasicBlock, 42% of the parameters: keeping it saves a fifth of a step's all-gather
// traffic, and peak memory is unchanged (backward would re-gather it right away).
bool Runtime::frees_after_forward(size_t unit) const { return reshard_after_forward_ && unit < first_kept_; }

void Runtime::release_all() {
  for (Unit& unit : units_)
    if (unit.flat) unit.flat->release();
}

// A forward without grad, as far as Note [When one-sided gathers may read] goes.
void Runtime::with_all_gathered(const std::function<void()>& fn) {
  shards_barrier("barrier: shards final");
  for (Unit& unit : units_)
    if (unit.flat) unit.flat->gather_async();
  for (Unit& unit : units_)
    if (unit.flat) unit.flat->wait_gathered();
  try {
    fn();
  } catch (...) {
    release_all();
    throw;  // a rank whose fn threw leaves the others at the barrier below: they time out naming it
  }
  release_all();
  shards_barrier("barrier: gathers done");
  shards_final_ = false;  // a load may come next
}

// The nearest unit with parameters before (direction -1) or after (+1) `unit`, or -1.
int64_t Runtime::neighbour(size_t unit, int direction) const {
  for (int64_t k = static_cast<int64_t>(unit) + direction; k >= 0 && k < static_cast<int64_t>(units_.size());
       k += direction)
    if (units_[static_cast<size_t>(k)].flat) return k;
  return -1;
}

// Note [Prefetch one unit ahead]
// The communicator runs its operations in the order they were issued, on its own
// thread. So the unit's own all-gather is issued first (unless a prefetch already did),
// then the neighbour's, and only then does the caller wait for its own: while the unit
// computes, the next unit's parameters are on their way. Every rank runs the same units
// in the same order, so the ranks issue the same collectives in the same order. The
// order is the stage order (forward) and its reverse (backward), which is the execution
// order of a sequence of stages by construction. One-sided gathers (Note [When one-sided
// gathers may read]) are not prefetched: they copy on this thread when the unit is
// needed, and nothing would overlap with them on a core that the copy occupies anyway.
void Runtime::gather(size_t unit, int direction) {
  FlatParameter& flat = *units_[unit].flat;
  flat.gather_async();
  if (const int64_t next = neighbour(unit, direction); next >= 0) units_[static_cast<size_t>(next)].flat->gather_async();
  const int64_t done = flat.wait_gathered();
  if (done >= 0 && trace::enabled()) {  // one-sided gathers run on this thread
    const int track = flat.gathers_one_sided() ? trace::thread_track() : comm_track_;
    trace::record("all_gather " + units_[unit].name, "fsdp", track, flat.gather_issued_us(),
                  std::max<int64_t>(done - flat.gather_issued_us(), 0));
  }
}

// Note [Did the optimizer step the shards?]
// The optimizer must be built over fsdp.parameters(), the shards. One built over the
// module's own parameters (before or after wrapping) would find no gradient on them
// (FSDP reduces the gradients into the shards and drops the full ones) and silently
// change nothing. So each training forward looks back at the last synchronised
// backward: did some shard change since (an optimizer step bumps its version), or lose
// its gradient (zero_grad)? Until the first step is seen, two backwards in a row that no
// step followed are an error. Not one: a GradScaler may skip a first step whose
// gradients overflowed. Not after a step was seen: that optimizer is the right one, and
// later skips are its business. Accumulating gradients over several backwards before
// the first step belongs under no_sync(). Under the per-parameter layout the optimizer
// steps the local shards, views of the shard: they share its version counter, so a step
// of any of them is seen, and their gradients are what zero_grad drops.
void Runtime::check_optimizer_stepped() {
  if (versions_after_backward_.empty() || ever_stepped_) return;
  const std::vector<Tensor> shards = sharded_params();
  bool has_grad = false;
  for (size_t k = 0; k < shards.size(); ++k) {
    ever_stepped_ = ever_stepped_ || shards[k].version() != versions_after_backward_[k];
    has_grad = has_grad || shards[k].grad().defined();
  }
  if (ever_stepped_ || !has_grad) {
    unstepped_backwards_ = 0;
    return;
  }
  LOOM_CHECK(++unstepped_backwards_ < 2, "FullyShardedDataParallel: the last ", unstepped_backwards_, " backwards "
             "reduced gradients into the sharded parameters, but no optimizer step changed them. Is the optimizer "
             "built over the unsharded module's parameters (model->parameters())? Build it over the FSDP module's "
             "parameters, the shards: optim::SGD(fsdp.parameters(), ...). To accumulate gradients over several "
             "backwards without a step, run the earlier ones under fsdp.no_sync()");
}

Tensor Runtime::forward(const Tensor& input) {
  if (in_backward_) {
    // A backward started and never reached finalize(): it threw. Its reduce-scatters may
    // be in flight and the ranks may disagree about what comes next.
    drain();
    in_backward_ = false;
    LOOM_FAIL("FullyShardedDataParallel: the previous backward started reducing gradients but did not finish (an "
              "exception ended it). The ranks may now disagree about which collectives come next; fix the first "
              "error and restart every rank");
  }
  const bool grad = GradMode::is_enabled();
  if (!shards_final_) {  // See Note [When one-sided gathers may read]
    shards_barrier("barrier: shards final");
    shards_final_ = true;
  }
  if (grad && sync_) check_optimizer_stepped();
  versions_after_backward_.clear();
  std::weak_ptr<Runtime> weak = weak_from_this();
  Tensor x = input;
  for (size_t u = 0; u < units_.size(); ++u) {
    Unit& unit = units_[u];
    if (unit.flat) gather(u, +1);
    {
      trace::Span span("forward " + unit.name, "fsdp");
      for (const auto& stage : unit.stages) x = (*stage)(x);  // module(x): a stage's hooks run
    }
    if (!unit.flat) continue;
    if (grad && x.requires_grad()) {
      x.register_hook([weak, u](const Tensor&) {
        if (auto runtime = weak.lock()) runtime->pre_backward(u);
        return Tensor();  // keep the gradient as it is
      });
    }
    if (!grad || frees_after_forward(u)) unit.flat->release();
  }
  if (!grad) {  // no backward follows: Note [When one-sided gathers may read]
    shards_barrier("barrier: gathers done");
    shards_final_ = false;
  }
  return x;
}

// Note [FSDP under a pipeline]
// A pipeline stage runs each of its virtual stages once per micro-batch, M forwards and M
// backwards a step, interleaved as its schedule says (1F1B on stage 0 of 2, M = 4:
// F0 F1 B0 F2 B1 F3 B2 B3), and the virtual stage's gradients are complete only after its last
// backward. So FSDP's step is stretched over the micro-batches, as torchtitan runs
// FSDP2 under a pipeline (parallel/pipeline/stage_sharding.h drives it):
// - Whether a backward reduces is decided when it starts (sync(), read by its first
//   pre-backward hook), not at the forward: under 1F1B the last micro-batch's forward
//   comes before the earlier micro-batches' backwards. Before each backward the stage
//   says whether it is the virtual stage's last of the step: the earlier ones accumulate the
//   full gradients on the module's parameters (no_sync), the last one reduce-scatters
//   their sum, once per unit and step, while it runs.
// - With reshard_after_forward false (shard_stage's default, torchtitan's
//   `reshard_after_forward = not pp_enabled`) and set_reshard_after_backward(false) for
//   the backwards that do not reduce, a unit is gathered by the step's first forward
//   and stays gathered to the last backward: one gather per unit and step instead of
//   2M. The price is the unit's full parameters for the whole step, next to the full
//   gradients that accumulate there anyway. With reshard_after_forward (FULL_SHARD
//   proper) every forward and every backward gathers and frees: 2M gathers per unit.
// - A reducing backward always frees its units, whatever set_reshard_after_backward
//   says: the optimizer step that follows rewrites the shards, and a unit kept gathered
//   would run the next step's forward on the old values.
// The first forward of the step meets the shard group at the one-sided barrier; the
// rest of the step's forwards and backwards meet nowhere but at the reduce-scatters
// (Note [When one-sided gathers may read]).
void Runtime::pre_backward(size_t unit) {
  if (!in_backward_) {
    in_backward_ = true;
    reducing_ = sync_;  // decided per backward: Note [FSDP under a pipeline]
    std::weak_ptr<Runtime> weak = weak_from_this();
    autograd::queue_callback([weak] {
      if (auto runtime = weak.lock()) runtime->finalize();
    });
  }
  gather(unit, -1);  // re-gathers what FULL_SHARD freed; see Note [Releasing a gathered unit]
}

void Runtime::on_gradient_ready(size_t unit, size_t index) {
  if (!reducing_) return;  // no_sync(), or a backward without an FSDP forward
  FlatParameter& flat = *units_[unit].flat;
  if (!flat.mark_ready(index)) return;
  // Every parameter of the unit has its gradient: the nodes that read the unit's
  // parameters have all run (each computes its parameter's gradient), so the gathered
  // values are no longer needed either.
  reduce_launch_us_.push_back(trace::now_us());
  reduce_works_.push_back(flat.reduce_async(world_));
  launched_.push_back(unit);
  flat.release();
  // Note [Shape-only steps wait for each reduce-scatter]
  // In a shape-only step (a memory estimate, core/shape_only.h) the backward computes
  // nothing, so every unit's full-size gradient buffer would wait at once in the
  // communicator's queue for its reduce-scatter, and the estimate would count them all.
  // In training the reduce-scatters keep pace with a backward that does compute, and
  // each buffer goes back before the next unit's is made; waiting here models that.
  if (shape_only() && reduce_works_.back()) reduce_works_.back()->wait();
}

void Runtime::finalize() {
  in_backward_ = false;
  const bool reducing = reducing_;
  try {
    if (reducing) {
      size_t with_params = 0;
      for (const Unit& unit : units_) with_params += unit.flat ? 1 : 0;
      if (launched_.size() != with_params) fail_unready();
      std::vector<std::shared_ptr<distributed::Work>> replicated;
      for (size_t k = 0; k < launched_.size(); ++k) {
        const Unit& unit = units_[launched_[k]];
        if (reduce_works_[k]) {
          reduce_works_[k]->wait();
          const int64_t done = ddp::completion_us(*reduce_works_[k]);
          if (done >= 0 && trace::enabled())
            trace::record("reduce_scatter " + unit.name, "fsdp", comm_track_, reduce_launch_us_[k],
                          std::max<int64_t>(done - reduce_launch_us_[k], 0));
        }
        if (replicate_group_) replicated.push_back(replicate_group_->all_reduce(unit.flat->reduced_grad(), ReduceOp::Sum));
      }
      all_reduces_ += static_cast<int64_t>(replicated.size());
      if (replicate_group_) {
        trace::Span span("all_reduce across replicas", "fsdp");
        for (const auto& work : replicated) work->wait();
      }
      for (size_t unit : launched_) units_[unit].flat->accumulate_reduced_grad();
      for (const Tensor& shard : sharded_params()) versions_after_backward_.push_back(shard.version());
    }
  } catch (...) {
    drain();
    forget_backward();
    throw;
  }
  forget_backward();
  // A synchronised backward frees every unit, whose backward may not have run; one that
  // does not reduce keeps them gathered if asked: Note [FSDP under a pipeline].
  if (reducing || reshard_after_backward_) release_all();
  if (reducing) shards_final_ = false;  // the optimizer steps next: Note [When one-sided gathers may read]
}

// What one backward's reduce-scatters left behind, cleared after it finished or failed.
void Runtime::forget_backward() {
  launched_.clear();
  reduce_works_.clear();
  reduce_launch_us_.clear();
  for (Unit& unit : units_)
    if (unit.flat) unit.flat->reset_ready();
  reducing_ = false;
}

[[noreturn]] void Runtime::fail_unready() {
  std::string missing;
  size_t count = 0;
  for (size_t u = 0; u < units_.size(); ++u) {
    if (!units_[u].flat || std::find(launched_.begin(), launched_.end(), u) != launched_.end()) continue;
    for (const std::string& name : units_[u].flat->names())
      if (++count <= 20) missing += "\n  " + name + " (unit " + units_[u].name + ")";
  }
  drain();
  LOOM_FAIL("FullyShardedDataParallel: backward finished, but some units did not receive every parameter's gradient, "
            "so their gradients could not be reduce-scattered (parameters of incomplete units:", missing,
            count > 20 ? "\n  ..." : "", "). Every parameter of the wrapped module must take part in the loss, in "
            "every synchronised backward");
}

void Runtime::drain() noexcept {
  for (const auto& work : reduce_works_) {
    if (!work) continue;
    try {
      work->wait();
    } catch (...) {  // reported by whoever waited first
    }
  }
}

}  // namespace loom::fsdp
