// Reducer: averages gradients across ranks while backward is still running (the heart
// of DistributedDataParallel, as PyTorch's c10d::Reducer).
//
//   parameters ──hooks──► buckets ──async all_reduce──► (overlaps the rest of backward)
//                                        │
//   backward ends ──final callback──► finalize: wait, write averaged gradients back
//
// 1. Construction splits the parameters into buckets (compute_bucket_assignment_by_size,
//    Note [Bucket order]), gives each bucket one flat buffer, and registers a
//    post-accumulate-grad hook on every parameter.
// 2. DistributedDataParallel::forward calls prepare_for_backward(outputs): the next
//    backward's gradients are to be reduced.
// 3. During backward, a parameter's hook fires as soon as its gradient is final (Note
//    [AccumulateGrad runs first] in autograd/engine.h). The gradient is copied into its
//    bucket slot, divided by the world size on the way (Note [Divide on the way in]).
//    When a bucket's last gradient arrives, its all_reduce is launched at once, in
//    bucket order (Note [Buckets launch in order]); the communicator's worker thread
//    moves it while backward computes earlier layers.
// 4. When backward has computed every gradient, finalize() runs (Note [When the reducer
//    finalizes]): it waits for every bucket and writes the averages back into each
//    parameter's .grad() (or leaves .grad() as a view into the bucket:
//    gradient_as_bucket_view). The optimizer step that follows sees averaged gradients.
//
// Unused parameters: with find_unused_parameters = false every parameter must get a
// gradient in every synchronised backward, or finalize throws an error naming those that
// did not. With true, prepare_for_backward walks the autograd graph from the outputs;
// parameters it cannot reach are marked ready (with zeros) as soon as backward starts, so
// their buckets are not held up, and a parameter no rank used keeps its .grad() as is.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "parallel/comm/communicator.h"
#include "parallel/ddp/bucket_assignment.h"
#include "parallel/ddp/debug.h"

namespace loom::ddp {

struct ReducerOptions {
  // The first bucket's byte limit and every later one's (Note [Bucket order]).
  size_t first_bucket_bytes = kDefaultFirstBucketBytes;
  size_t bucket_cap_bytes = kDefaultBucketCapBytes;
  // The last bucket's byte limit (Note [A small last bucket]).
  size_t last_bucket_bytes = kDefaultFirstBucketBytes;
  bool find_unused_parameters = false;
  bool gradient_as_bucket_view = false;
};

struct Bucket {
  std::vector<size_t> params;    // registration indices, in the order they sit in `flat`
  std::vector<int64_t> offsets;  // element offset of each in `flat`
  Tensor flat;                   // one contiguous buffer: one dtype, one device
  std::vector<Tensor> views;     // views[k]: the slot of params[k], shaped like it
};

// When the last synchronised backward did what, in trace::now_us() microseconds: the
// overlap evidence (tests assert on it; the tracer draws it).
struct BackwardTimeline {
  int64_t first_gradient_us = -1;  // the first parameter hook
  int64_t last_gradient_us = -1;   // the last: every gradient is computed from here on
  int64_t finalize_begin_us = -1;
  int64_t finalize_end_us = -1;
  std::vector<int64_t> launch_us;    // per bucket: all_reduce issued
  std::vector<int64_t> complete_us;  // per bucket: all_reduce finished (-1: not known to the host yet)
};

class Reducer : public std::enable_shared_from_this<Reducer> {
 public:
  // params: those that require grad, in registration order; names: theirs, for messages.
  // announcer: DDP's (numbers its collectives; Note [DDP fingerprints]); null makes one.
  static std::shared_ptr<Reducer> create(std::vector<Tensor> params, std::vector<std::string> names,
                                         std::shared_ptr<distributed::Communicator> comm, ReducerOptions options = {},
                                         std::shared_ptr<Announcer> announcer = nullptr);
  // Waits for any all_reduce still writing into the buckets (only after an exception).
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // The next backward is to be synchronised. outputs: the forward's outputs, used to find
  // unused parameters when find_unused_parameters is on.
  void prepare_for_backward(const std::vector<Tensor>& outputs);
  // The next backward accumulates locally, without communication (DDP's no_sync()).
  void prepare_for_local_backward();

  const std::vector<Bucket>& buckets() const { return buckets_; }
  const std::vector<std::string>& names() const { return names_; }
  const std::vector<Tensor>& parameters() const { return params_; }
  // Synchronised forwards so far.
  int64_t iteration() const { return iteration_; }
  const BackwardTimeline& last_backward() const { return timeline_; }
  // A table of the buckets: index, parameter count, bytes, first and last parameter.
  std::string layout() const;

 private:
  Reducer(std::vector<Tensor> params, std::vector<std::string> names, std::shared_ptr<distributed::Communicator> comm,
          ReducerOptions options, std::shared_ptr<Announcer> announcer);
  void build_buckets();
  void register_hooks();
  void start_iteration();

  void on_gradient_ready(size_t index);  // a parameter's post-accumulate hook
  void mark_ready(size_t index, bool unused);
  void launch_ready_buckets();
  void finalize();                       // see Note [When the reducer finalizes]
  void wait_and_write_back();
  void drain() noexcept;                 // waits for launched work, ignoring its errors
  [[noreturn]] void fail_unready();
  void trace_backward() const;

  std::vector<Tensor> params_;
  std::vector<std::string> names_;
  std::shared_ptr<distributed::Communicator> comm_;
  ReducerOptions options_;
  std::shared_ptr<Announcer> announcer_;
  std::vector<Bucket> buckets_;
  std::vector<std::pair<size_t, size_t>> slot_of_;  // parameter -> (bucket, position)
  int comm_track_ = 0;

  // The iteration in progress.
  int64_t iteration_ = 0;
  bool expect_hooks_ = false;     // prepared: this backward is synchronised
  bool finalize_queued_ = false;  // the first hook has fired and queued finalize()
  std::vector<char> ready_;       // per parameter
  std::vector<char> used_;        // per parameter: its hook fired (find_unused_parameters)
  std::vector<size_t> unused_;    // found by prepare_for_backward
  std::vector<size_t> pending_;   // per bucket: parameters not ready yet
  size_t next_to_launch_ = 0;
  std::vector<std::shared_ptr<distributed::Work>> works_;
  std::vector<Announcement> announcements_;
  BackwardTimeline timeline_;
};

// dst <- src / world, in one pass (Note [Divide on the way in], reducer.cpp); a plain copy
// when world is 1. FSDP divides its gradients the same way, so that both agree bitwise.
void copy_divided(Tensor dst, const Tensor& src, int world);

// When `work` finished, in trace::now_us() microseconds, or -1 while it has not finished
// as far as the host knows (see Note [When did a bucket's all_reduce finish]).
int64_t completion_us(const distributed::Work& work);

// The parameters the autograd graph of `outputs` does not reach (registration indices):
// those whose gradient accumulator is not a node of the graph.
std::vector<size_t> find_unused_parameters(const std::vector<Tensor>& outputs, const std::vector<Tensor>& params);

}  // namespace loom::ddp
