// NcclCommunicator: the CUDA backend of Communicator, over NVIDIA's NCCL.
//
//   // one process per GPU, launched as: loomrun --nproc_per_node 2 ./train
//   loom::distributed::init_process_group("nccl");      // device = LOCAL_RANK
//   Tensor grad = ...;                                   // on cuda:LOCAL_RANK
//   auto work = default_group()->all_reduce(grad, ReduceOp::Avg);
//   work->wait();         // the *current stream* waits; the host does not (as PyTorch)
//   next_kernel(grad);    // runs after the all-reduce, on the GPU's own schedule
//
// Each rank drives one GPU (`device`). Construction is the rendezvous: rank 0 makes an
// ncclUniqueId and sets it in the store under `prefix`; the others get it; every rank
// then joins with ncclCommInitRankConfig. Tensors: CUDA tensors on `device`,
// contiguous; float32, float64, float16, bfloat16, int32, int64, uint8 (and bool for
// broadcast, all_gather, send and recv). CPU tensors belong to the gloo backend.
//
// This header includes no CUDA or NCCL header (it is read by generic code: the
// process group, the tests); nccl_communicator.cpp and the files next to it are
// compiled only when CUDA and NCCL are found (LOOM_WITH_NCCL).
//
// Note [NCCL streams]
// Each communicator owns a communication stream on its device (high priority, so that
// its kernels get SMs while compute kernels run). For every operation:
//  1. an event recorded on the caller's current stream makes the communication stream
//     wait: the NCCL kernel reads the tensor only after the kernels that wrote it;
//  2. every tensor of the op is record_stream'ed on the communication stream, so the
//     caching allocator does not hand its memory to anyone before the op is done, even
//     if the caller drops the tensor at once (Note [Allocator streams]);
//  3. the NCCL call is enqueued on the communication stream, and a completion event
//     recorded after it.
// Work::wait() makes the caller's *current stream* wait for the completion event and
// returns at once: the host runs ahead, the GPU keeps the order. This is PyTorch's
// ProcessGroupNCCL contract: kernels launched after wait() see the result; host code
// that reads the tensor must synchronize first (Work::synchronize(), or a copy to the
// CPU, which synchronizes). barrier()'s wait() blocks the host, as PyTorch's does.
// is_completed() asks the event without blocking.
//
// Note [NCCL timeouts and the watchdog]
// An NCCL kernel waiting for a rank that never comes spins on the GPU forever, and the
// host, which does not wait for it, cannot notice. So:
// - the communicator is *non-blocking* (ncclConfig_t::blocking = 0): no NCCL call blocks
//   the host; a call that must wait for the peers (joining, connecting on first use)
//   returns ncclInProgress and loom polls ncclCommGetAsyncError until the deadline;
// - a watchdog thread polls the completion events of outstanding operations (and NCCL's
//   asynchronous errors). When one passes its deadline, timeout() after it was issued,
//   the watchdog calls ncclCommAbort: the spinning kernels exit, the communicator is
//   marked failed, every outstanding Work fails with an error naming the rank, the
//   operation, its number, dtype and shape, and later operations fail at once naming
//   the first failure (Note [Nothing hangs forever] in communicator.h). Data written by
//   an aborted operation is garbage; a stream that already waited on it runs on.
//
// With verify_collectives (default on, as the gloo backend) every collective first
// compares fingerprints through the store, and every recv checks its sender's header,
// so mismatched shapes or operations are an error on every rank instead of a hang or
// silent corruption (Note [Fingerprints through the store], store_fingerprints.h). It
// also makes a missing rank a timeout before any kernel is launched. Its price: the
// host waits, in each call, until every rank's host has reached that call.
//
// Point-to-point: NCCL matches the messages between two ranks in call order; tags do
// not reorder them (a recv whose tag differs from its sender's is an error). A send and
// a recv are two kernels in order on one stream, so two ranks that each recv first and
// send second wait for each other forever: post the send first on one side.
//
// Verified here only by compiling: nothing of this file's implementation has run on a
// GPU in the machine it was written on. What a GPU run must confirm is listed at the top
// of tests/test_comm_nccl.cpp.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cuda/device.h"  // defines: loom::cuda::Stream, Event (no CUDA header)
#include "parallel/comm/communicator.h"
#include "parallel/comm/store_fingerprints.h"
#include "parallel/store/tcp_store.h"

struct ncclComm;  // NCCL's communicator; ncclComm_t is ncclComm*

namespace loom::distributed {

class NcclWork;

struct NcclOptions {
  std::chrono::milliseconds timeout = kDefaultCommTimeout;
  // Fingerprints through the store before every collective, headers before every recv
  // (see above). Turning it off saves a few store round trips per operation; a shape
  // mismatch may then hang until the timeout or corrupt memory.
  bool verify_collectives = true;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<TCPStore> store, const std::string& prefix, int rank, int size, int device,
                   NcclOptions options = {});
  // Waits (up to the timeout) for outstanding operations, then releases NCCL's resources.
  ~NcclCommunicator() override;

  const char* backend() const override { return "nccl"; }
  int device() const { return device_; }
  Device tensor_device() const override { return Device(DeviceType::CUDA, device_); }
  // The communication stream (for tracing, or to order side work after communication).
  cuda::Stream stream() const { return stream_; }
  // Empty while healthy; otherwise the first failure (a timeout, an NCCL error).
  std::string failure() const;

  // The GPU a rank drives when none is named: LOCAL_RANK (set by loomrun) if set, else
  // rank % (visible GPUs), as PyTorch guesses. Throws a teaching error without a GPU.
  static int default_device(int rank);

 protected:
  std::shared_ptr<Work> launch(Op op) override;

 private:
  // nccl_communicator.cpp: checks, verification and the NCCL calls.
  void check_tensor(const Op& op) const;
  std::optional<std::string> verify(const Op& op, StoreFingerprints::Deadline deadline);
  void enqueue(const Op& op, NcclWork& work, StoreFingerprints::Deadline deadline);
  void settle(StoreFingerprints::Deadline deadline, const std::string& what);
  void join(StoreFingerprints::Deadline deadline);
  void release_nccl();  // finalize + destroy, or abort; on destruction
  // Aborts NCCL (once), records `why` as the failure, and fails every outstanding Work.
  void fail_communicator(const std::string& why, const NcclWork* culprit = nullptr);
  std::string async_error();  // "" unless NCCL reports an asynchronous error

  // nccl_watchdog.cpp: see Note [NCCL timeouts and the watchdog].
  void track(std::shared_ptr<NcclWork> work);
  void watchdog_loop();
  void watchdog_check(const std::vector<std::shared_ptr<NcclWork>>& works);

  std::shared_ptr<TCPStore> store_;
  std::string key_prefix_;  // prefix + "/nccl"
  const int device_;
  const bool verify_;
  StoreFingerprints fingerprints_;

  std::mutex comm_mutex_;  // every NCCL call on comm_, and the abort
  ncclComm* comm_ = nullptr;
  cuda::Stream stream_{};
  cuda::Event ready_;      // re-recorded on the caller's stream before each op
  Tensor barrier_buffer_;  // barrier() all-reduces this one element

  mutable std::mutex failure_mutex_;
  std::string failure_;

  std::mutex works_mutex_;
  std::condition_variable works_cv_;
  std::vector<std::shared_ptr<NcclWork>> outstanding_;
  bool stopping_ = false;
  std::thread watchdog_;  // last: started when everything above exists
};

}  // namespace loom::distributed
