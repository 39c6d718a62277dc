// NcclCommunicator: joining, checks, verification and the NCCL calls. The watchdog is
// in nccl_watchdog.cpp; Notes [NCCL streams] and [NCCL timeouts and the watchdog] are
// in nccl_communicator.h.
#include "parallel/comm/nccl_communicator.h"

#include <cuda_runtime_api.h>  // defines: cudaStreamCreateWithPriority, cudaMemcpyAsync

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "core/error.h"
#include "core/factory.h"            // defines: zeros
#include "cuda/caching_allocator.h"  // defines: record_stream
#include "cuda/check.h"              // defines: LOOM_CUDA_CHECK
#include "parallel/comm/nccl_check.h"
#include "parallel/comm/nccl_work.h"

namespace loom::distributed {

using Clock = std::chrono::steady_clock;
using Deadline = StoreFingerprints::Deadline;
using std::chrono::milliseconds;
using detail::str;

namespace {

constexpr const char* kUseGloo = "Use backend \"gloo\" for CPU tensors: init_process_group(\"gloo\")";

void require_gpu(int rank) {
  LOOM_CHECK(cuda::is_available(), "backend \"nccl\" needs a CUDA GPU for rank ", rank, ", but ",
             cuda::unavailable_reason(), ". NCCL moves CUDA tensors only. ", kUseGloo);
}

// Note [Communication streams are never destroyed]
// A tensor record_stream'ed on the communication stream makes the allocator record an
// event on that stream when the tensor dies, which may be after its communicator is
// gone. So, as PyTorch's pool streams, these streams live until the process exits: a
// communicator returns its stream here when it dies, and the next one on that device
// takes it. A process holds as many as it ever had communicators at once per device.
std::mutex g_streams_mutex;
std::vector<cuda::Stream>& free_streams() {
  static auto* streams = new std::vector<cuda::Stream>();
  return *streams;
}

cuda::Stream acquire_stream(int device) {
  {
    std::lock_guard<std::mutex> lock(g_streams_mutex);
    auto& free = free_streams();
    auto it = std::find_if(free.begin(), free.end(), [&](const cuda::Stream& s) { return s.device == device; });
    if (it != free.end()) {
      cuda::Stream stream = *it;
      free.erase(it);
      return stream;
    }
  }
  cuda::DeviceGuard guard(device);
  int least = 0, greatest = 0;
  LOOM_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest), "asking cuda:", device,
                  " for its stream priorities");
  cudaStream_t stream = nullptr;
  LOOM_CUDA_CHECK(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest),
                  "creating the NCCL communication stream of cuda:", device);
  return cuda::Stream{stream, device};
}

void release_stream(cuda::Stream stream) {
  if (stream.handle == nullptr) return;
  std::lock_guard<std::mutex> lock(g_streams_mutex);
  free_streams().push_back(stream);
}

bool reduces(OpKind kind) { return kind == OpKind::AllReduce || kind == OpKind::ReduceScatter; }

ncclDataType_t nccl_dtype(DType dtype) {
  switch (dtype) {
    case kFloat32: return ncclFloat32;
    case kFloat64: return ncclFloat64;
    case kFloat16: return ncclFloat16;
    case kBFloat16: return ncclBfloat16;
    case kInt32: return ncclInt32;
    case kInt64: return ncclInt64;
    case kUInt8: return ncclUint8;
    case kBool: return ncclUint8;  // moved, never reduced (check_tensor)
  }
  LOOM_FAIL("nccl backend: no NCCL type for ", dtype_name(dtype));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;  // floating dtypes only: Communicator::all_reduce checked
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  LOOM_FAIL("unknown ReduceOp ", int(op));
}

// True when list[r] starts where list[r - 1] ends, in one storage: then the list is one
// flat buffer, which NCCL's all_gather and reduce_scatter read or write directly.
bool is_flat(const std::vector<Tensor>& list) {
  const auto* base = static_cast<const char*>(list[0].raw_data());
  const size_t nbytes = list[0].nbytes();
  for (size_t r = 1; r < list.size(); ++r)
    if (list[r].storage() != list[0].storage() || static_cast<const char*>(list[r].raw_data()) != base + r * nbytes)
      return false;
  return true;
}

// ncclGroupStart ... ncclGroupEnd; a group left by an exception is still closed, so that
// this thread's next NCCL call is not swallowed into it.
class NcclGroup {
 public:
  explicit NcclGroup(ncclComm_t comm) : comm_(comm) { LOOM_NCCL_CHECK(ncclGroupStart(), comm_, "starting a group"); }
  ~NcclGroup() {
    if (open_) (void)ncclGroupEnd();
  }
  void end(const std::string& what) {
    open_ = false;
    LOOM_NCCL_CHECK(ncclGroupEnd(), comm_, what);
  }

 private:
  ncclComm_t comm_;
  bool open_ = true;
};

std::shared_ptr<Work> failed_work(const Op& op, const std::string& why) {
  auto work = std::make_shared<Work>(op.describe());
  work->finish(std::make_exception_ptr(Error(why)));
  return work;
}

milliseconds until(Deadline deadline) {
  return std::max(std::chrono::duration_cast<milliseconds>(deadline - Clock::now()), milliseconds(1));
}

}  // namespace

int NcclCommunicator::default_device(int rank) {
  require_gpu(rank);
  const int count = cuda::device_count();
  const char* local = std::getenv("LOCAL_RANK");
  if (local == nullptr || *local == '\0') return rank % count;
  char* end = nullptr;
  const long value = std::strtol(local, &end, 10);
  LOOM_CHECK(*end == '\0' && value >= 0, "LOCAL_RANK='", local, "' is not a local rank (an integer >= 0)");
  LOOM_CHECK(value < count, "LOCAL_RANK=", value, " but this machine has ", count, " visible GPU", count == 1 ? "" : "s",
             ": the nccl backend runs one process per GPU. Start at most ", count, " processes per machine (loomrun "
             "--nproc_per_node ", count, "), or check CUDA_VISIBLE_DEVICES");
  return static_cast<int>(value);
}

NcclCommunicator::NcclCommunicator(std::shared_ptr<TCPStore> store, const std::string& prefix, int rank, int size,
                                   int device, NcclOptions options)
    : Communicator(rank, size, options.timeout),
      store_(std::move(store)),
      key_prefix_(prefix + "/nccl"),
      device_(device),
      verify_(options.verify_collectives),
      fingerprints_(store_, key_prefix_, rank, size) {
  require_gpu(rank);
  LOOM_CHECK(device >= 0, "NcclCommunicator: expected a CUDA device index >= 0, got ", device,
             "; NcclCommunicator::default_device(rank) picks the usual one");
  cuda::check_device(Device(DeviceType::CUDA, device));
  const Deadline deadline = Clock::now() + timeout();
  cuda::DeviceGuard guard(device_);
  try {
    join(deadline);
    stream_ = acquire_stream(device_);
    barrier_buffer_ = zeros({1}, TensorOptions(kFloat32).device(Device(DeviceType::CUDA, device_)));
    cuda::record_stream(barrier_buffer_, stream_);
  } catch (const std::exception& e) {
    if (comm_ != nullptr) (void)ncclCommAbort(comm_);
    comm_ = nullptr;
    release_stream(stream_);
    LOOM_FAIL("NCCL rendezvous of group '", prefix, "' failed on rank ", rank, " of ", size, " (cuda:", device, "): ",
              e.what(), ". Every rank must create this group (same name, same world size, one GPU each) within "
              "the timeout (", timeout().count(), " ms)");
  }
  watchdog_ = std::thread([this] { watchdog_loop(); });
}

// Rank 0 makes the unique id (it names rank 0's bootstrap socket) and publishes it; all
// join with a non-blocking ncclCommInitRankConfig, polled until every rank is in.
void NcclCommunicator::join(Deadline deadline) {
  const std::string key = key_prefix_ + "/unique_id";
  ncclUniqueId id;
  if (rank() == 0) {
    LOOM_NCCL_CHECK(ncclGetUniqueId(&id), nullptr, "making the unique id of NCCL group '", key_prefix_, "'");
    store_->set(key, std::string(id.internal, sizeof(id.internal)));
  } else {
    try {
      store_->wait({key}, until(deadline));
    } catch (const Error& e) {
      LOOM_FAIL("rank 0 did not publish the NCCL unique id in time [", e.what(), "]");
    }
    const std::string bytes = store_->get(key);
    LOOM_CHECK(bytes.size() == sizeof(id.internal), "the store key '", key, "' holds ", bytes.size(),
               " bytes, not an NCCL unique id: another program uses this group name");
    std::memcpy(id.internal, bytes.data(), sizeof(id.internal));
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // see Note [NCCL timeouts and the watchdog]
  const std::string what = str("joining NCCL group '", key_prefix_, "' as rank ", rank(), " of ", size());
  LOOM_NCCL_CHECK(ncclCommInitRankConfig(&comm_, size(), id, rank(), &config), comm_, what);
  settle(deadline, what);
}

// The caller holds comm_mutex_ (or is the constructor). Polls until the last call on
// comm_ has left ncclInProgress; throws its error, or a timeout at `deadline`.
void NcclCommunicator::settle(Deadline deadline, const std::string& what) {
  ncclResult_t state = ncclInProgress;
  for (auto pause = std::chrono::microseconds(10);; pause = std::min<std::chrono::microseconds>(pause * 2, milliseconds(1))) {
    LOOM_NCCL_CHECK(ncclCommGetAsyncError(comm_, &state), comm_, "asking NCCL about ", what);
    if (state != ncclInProgress) break;
    LOOM_CHECK(Clock::now() < deadline, "timed out after ", timeout().count(), " ms while ", what, ": NCCL was still "
               "waiting for the other ranks. They have not reached this point: they may have crashed, be stuck or "
               "slower than the timeout, or be calling operations in a different order. Check their output");
    std::this_thread::sleep_for(pause);
  }
  if (state != ncclSuccess) nccl_detail::throw_nccl_error(state, comm_, "ncclCommGetAsyncError", what, __FILE__, __LINE__);
}

NcclCommunicator::~NcclCommunicator() {
  {
    std::lock_guard<std::mutex> lock(works_mutex_);
    stopping_ = true;
  }
  works_cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();  // returns when every op completed or failed at its deadline
  release_nccl();
  barrier_buffer_ = Tensor();  // its last use on stream_ is tracked; see Note [Communication streams ...]
  release_stream(stream_);
}

// Finalize flushes this rank's communication and waits until the peers are done with
// it; then destroy is local. A failure or a peer that never finalizes: abort.
void NcclCommunicator::release_nccl() {
  std::lock_guard<std::mutex> lock(comm_mutex_);
  if (comm_ == nullptr) return;
  try {
    cuda::DeviceGuard guard(device_);
    const Deadline deadline = Clock::now() + std::min(timeout(), milliseconds(std::chrono::seconds(30)));
    LOOM_NCCL_CHECK(ncclCommFinalize(comm_), comm_, "finalizing");
    settle(deadline, "finalizing the NCCL communicator");
    LOOM_NCCL_CHECK(ncclCommDestroy(comm_), comm_, "destroying");
    comm_ = nullptr;
  } catch (const std::exception&) {
    (void)ncclCommAbort(comm_);  // a destructor does not throw; abort waits for no one
    comm_ = nullptr;
  }
}

std::string NcclCommunicator::failure() const {
  std::lock_guard<std::mutex> lock(failure_mutex_);
  return failure_;
}

void NcclCommunicator::fail_communicator(const std::string& why, const NcclWork* culprit) {
  {
    std::lock_guard<std::mutex> lock(failure_mutex_);
    if (failure_.empty()) failure_ = why;
  }
  // Fail the outstanding Works before aborting: the abort lets their kernels exit, so
  // their completion events pass, and a caller polling one in between would take that
  // for success and read whatever the buffers hold.
  std::vector<std::shared_ptr<NcclWork>> works;
  {
    std::lock_guard<std::mutex> lock(works_mutex_);
    works = outstanding_;
  }
  for (const auto& work : works) {
    std::string message = work.get() == culprit
                              ? why + ". The NCCL communicator was aborted and cannot be used any more"
                              : str(work->description(), " failed: the NCCL communicator was aborted because ", why);
    work->fail(std::make_exception_ptr(Error(message)));
  }
  {
    std::lock_guard<std::mutex> lock(comm_mutex_);
    if (comm_ != nullptr) {
      std::optional<cuda::DeviceGuard> guard;
      try {
        guard.emplace(device_);
      } catch (const std::exception&) {  // abort anyway
      }
      (void)ncclCommAbort(comm_);  // the kernels of every outstanding operation exit
      comm_ = nullptr;
    }
  }
}

std::string NcclCommunicator::async_error() {
  std::unique_lock<std::mutex> lock(comm_mutex_, std::try_to_lock);  // busy: the caller's settle() will see it
  if (!lock.owns_lock() || comm_ == nullptr) return "";
  ncclResult_t state = ncclSuccess;
  if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess || state == ncclSuccess || state == ncclInProgress) return "";
  return str("NCCL reported an asynchronous error: ", ncclGetErrorString(state), " (", nccl_detail::result_name(state),
             "). NCCL says: ", ncclGetLastError(comm_), ". ", nccl_detail::hint(state));
}

// ---- issuing an operation ---------------------------------------------------------------

void NcclCommunicator::check_tensor(const Op& op) const {
  const Tensor& t = op.tensor;  // op.list matches it (communicator.cpp checked)
  if (!t.defined()) return;     // barrier
  LOOM_CHECK(t.device().is_cuda(), op.describe(), ": the nccl backend moves CUDA tensors, got one on ", t.device(),
             ". Use the gloo backend for CPU tensors (init_process_group(\"gloo\")), or move the tensor with "
             ".to(\"cuda:", device_, "\")");
  LOOM_CHECK(t.device().index == device_, op.describe(), ": this communicator drives cuda:", device_, " (one GPU per "
             "rank) but the tensor is on ", t.device(), ". Move it with .to(\"cuda:", device_, "\"), or create each "
             "rank's communicator on the GPU its tensors live on");
  LOOM_CHECK(t.dtype() != kBool || !reduces(op.kind), op.describe(), ": NCCL does not reduce bool tensors; convert "
             "to uint8 (max = any, min = all) or to int32 (sum = count)");
}

std::shared_ptr<Work> NcclCommunicator::launch(Op op) {
  check_tensor(op);  // a wrong argument throws at the call, as in the gloo backend
  if (std::string first = failure(); !first.empty())
    return failed_work(op, str(op.describe(), " was not run: this communicator failed earlier and cannot be used any "
                               "more. Destroy it and create a new group on every rank. The first failure was: ", first));
  const Deadline deadline = Clock::now() + timeout();
  try {
    if (verify_ && size() > 1) {  // a world of one has no one to disagree with
      if (std::optional<std::string> mismatch = verify(op, deadline)) return failed_work(op, *mismatch);
    }
    auto work = std::make_shared<NcclWork>(op.describe(), device_, deadline, op.kind == OpKind::Barrier);
    enqueue(op, *work, deadline);
    track(work);
    return work;
  } catch (const std::exception& e) {
    const std::string why = str(op.describe(), " failed: ", e.what());
    fail_communicator(why);
    return failed_work(op, why + ". This communicator cannot be used any more");
  }
}

// See Note [Fingerprints through the store]. A mismatch is returned (every rank sees it,
// nothing moved, the communicator stays usable); a rank that never comes throws.
std::optional<std::string> NcclCommunicator::verify(const Op& op, Deadline deadline) {
  if (op.kind == OpKind::Send) {
    fingerprints_.post_header(op);
    return std::nullopt;
  }
  if (op.kind == OpKind::Recv) {
    std::optional<Fingerprint> header = fingerprints_.take_header(op, deadline);
    LOOM_CHECK(header.has_value(), "timed out after ", timeout().count(), " ms: rank ", op.peer, " sent nothing to this "
               "rank in that time. It may have crashed, be stuck or slower than the timeout, or be waiting for a "
               "message from this rank (two ranks that both recv before they send wait for each other)");
    const Fingerprint mine = fingerprint(op, op.tag);
    if (header->same_tensor(mine) && header->id() == op.tag) return std::nullopt;
    // Receive the sender's message anyway, into scratch: its send completes and the two
    // ranks stay in step (as the gloo backend does).
    Op drain = op;
    drain.tensor = empty({header->words[4]}, TensorOptions(DType(header->words[3])).device(op.tensor.device()));
    auto work = std::make_shared<NcclWork>(op.describe() + " (dropping a mismatched message)", device_, deadline, false);
    enqueue(drain, *work, deadline);
    track(work);
    if (!header->same_tensor(mine))
      return str(op.describe(), " failed: rank ", op.peer, " sent ", header->tensor_str(), " but this recv expects ",
                 mine.tensor_str(), ". The message was received into scratch memory and dropped; the communicator "
                 "is still usable");
    return str(op.describe(), " failed: rank ", op.peer, "'s next message to this rank has tag ", header->id(),
               ". NCCL delivers the messages between two ranks in the order they were sent; tags do not reorder "
               "them, so receive in that order. The message was dropped; the communicator is still usable");
  }
  StoreFingerprints::Gathered gathered = fingerprints_.gather(op, deadline);
  if (!gathered.missing.empty()) {
    std::string ranks;
    for (int r : gathered.missing) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    LOOM_FAIL("timed out after ", timeout().count(), " ms: rank", gathered.missing.size() > 1 ? "s " : " ", ranks,
              " did not reach this collective (no fingerprint in the store). It may have crashed, be stuck or slower "
              "than the timeout, or be calling collectives in a different order. Check the other ranks' output");
  }
  try {
    check_same_collective(gathered.all, op);
  } catch (const Error& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

// Steps 1-3 of Note [NCCL streams].
void NcclCommunicator::enqueue(const Op& op, NcclWork& work, Deadline deadline) {
  std::lock_guard<std::mutex> lock(comm_mutex_);
  LOOM_CHECK(comm_ != nullptr, "the NCCL communicator was aborted: ", failure());
  cuda::DeviceGuard guard(device_);
  ready_.record(cuda::current_stream(device_));
  ready_.wait(stream_);
  const Tensor& t = op.tensor;
  if (t.defined()) cuda::record_stream(t, stream_);
  for (const Tensor& x : op.list) cuda::record_stream(x, stream_);

  cudaStream_t s = stream_.handle;
  const size_t count = t.defined() ? static_cast<size_t>(t.numel()) : 0;
  const std::string& what = work.description();
  if (op.kind == OpKind::Barrier) {
    void* one = barrier_buffer_.raw_data();
    LOOM_NCCL_CHECK(ncclAllReduce(one, one, 1, ncclFloat32, ncclSum, comm_, s), comm_, what);
  } else if (count > 0) {  // every rank agrees on the shape, so every rank skips an empty op
    const ncclDataType_t type = nccl_dtype(t.dtype());
    void* data = t.raw_data();
    switch (op.kind) {
      case OpKind::AllReduce:
        LOOM_NCCL_CHECK(ncclAllReduce(data, data, count, type, nccl_op(op.reduce), comm_, s), comm_, what);
        break;
      case OpKind::Broadcast:
        LOOM_NCCL_CHECK(ncclBroadcast(data, data, count, type, op.peer, comm_, s), comm_, what);
        break;
      case OpKind::AllGather:
        if (is_flat(op.list)) {
          LOOM_NCCL_CHECK(ncclAllGather(data, op.list[0].raw_data(), count, type, comm_, s), comm_, what);
        } else {  // one broadcast per rank, fused: each output filled in place, no staging copy
          NcclGroup group(comm_);
          for (int r = 0; r < size(); ++r)
            LOOM_NCCL_CHECK(ncclBroadcast(data, op.list[r].raw_data(), count, type, r, comm_, s), comm_, what);
          group.end(what);
        }
        break;
      case OpKind::ReduceScatter: {
        Tensor flat;  // the inputs side by side, unless they already are
        if (!is_flat(op.list)) {
          flat = empty({t.numel() * size()}, TensorOptions(t.dtype()).device(t.device()));
          cuda::record_stream(flat, stream_);
          auto* bytes = static_cast<char*>(flat.raw_data());
          for (int r = 0; r < size(); ++r)
            LOOM_CUDA_CHECK(cudaMemcpyAsync(bytes + r * t.nbytes(), op.list[r].raw_data(), t.nbytes(),
                                            cudaMemcpyDeviceToDevice, s), "staging the inputs of ", what);
        }
        const void* in = flat.defined() ? flat.raw_data() : op.list[0].raw_data();
        LOOM_NCCL_CHECK(ncclReduceScatter(in, data, count, type, nccl_op(op.reduce), comm_, s), comm_, what);
        break;
      }
      case OpKind::Send:
      case OpKind::Recv: {
        NcclGroup group(comm_);
        if (op.kind == OpKind::Send) LOOM_NCCL_CHECK(ncclSend(data, count, type, op.peer, comm_, s), comm_, what);
        else LOOM_NCCL_CHECK(ncclRecv(data, count, type, op.peer, comm_, s), comm_, what);
        group.end(what);
        break;
      }
      case OpKind::Barrier: break;  // handled above
    }
  }
  settle(deadline, "enqueueing " + what);
  work.done_event().record(stream_);
}

}  // namespace loom::distributed
