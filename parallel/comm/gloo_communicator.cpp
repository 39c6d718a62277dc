#include "parallel/comm/gloo_communicator.h"

#include <gloo/allgather.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <signal.h>  // defines: sigaction, for Note [Gloo's sockets and SIGPIPE]

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "parallel/comm/gloo_store.h"
#include "parallel/comm/host_reduce.h"  // defines: is_reducible
#include "parallel/comm/host_staging.h"  // defines: needs_host_staging, stage_on_host, copy_results_back
#include "parallel/comm/roll_call.h"     // defines: announce_host, roll_call

namespace loom::distributed {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Note [Leave the rendezvous together]
// connectFullMesh returns on a rank once *its* pairs are connected, while a peer may
// still be completing its side. A rank that then exits at once (or destroys the group)
// closes a connection the peer is still setting up, and the peer's rendezvous fails.
// So every rank checks in on a store counter and leaves only when all have, as
// PyTorch's store-based barrier after init_process_group.
static void wait_until_all_connected(TCPStore& store, const std::string& prefix, int size, milliseconds timeout) {
  const std::string all_in = prefix + "/all_connected";
  if (store.add(prefix + "/connected", 1) == size) store.set(all_in, "1");
  store.wait({all_in}, timeout);
}

// Note [Gloo's sockets and SIGPIPE]
// Gloo's TCP transport writes to its sockets without MSG_NOSIGNAL, so a write to a peer
// that already closed its end (a rank that finished or failed first) raises SIGPIPE,
// whose default action kills this process without a word (test_comm_gloo was, once,
// in a full test run). loom's own sockets (the store) pass MSG_NOSIGNAL and
// report a closed peer as an error naming it. For Gloo's, SIGPIPE is ignored process-
// wide, as servers do, so such a write fails with EPIPE, which Gloo reports as an
// error; only if the program has not chosen a disposition of its own (SIG_DFL).
static void ignore_sigpipe_unless_handled() {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL &&
      !(current.sa_flags & SA_SIGINFO))
    ::signal(SIGPIPE, SIG_IGN);
}

GlooCommunicator::GlooCommunicator(std::shared_ptr<TCPStore> store, const std::string& prefix, int rank, int size,
                                   GlooOptions options)
    : Communicator(rank, size, options.timeout),
      store_(std::move(store)),
      prefix_(prefix),
      verify_collectives_(options.verify_collectives) {
  LOOM_CHECK(store_ != nullptr, "GlooCommunicator: the store is null; create a TCPStore first");
  ignore_sigpipe_unless_handled();  // See Note [Gloo's sockets and SIGPIPE].
  try {
    gloo::transport::tcp::attr attr;
    if (!options.iface.empty()) attr.iface = options.iface;
    else attr.hostname = options.hostname;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(options.timeout);
    GlooStore adapter(*store_, options.timeout);
    gloo::rendezvous::PrefixStore prefixed(prefix, adapter);
    context->connectFullMesh(prefixed, device);
    announce_host(*store_, prefix, rank, options.iface.empty() ? options.hostname : "interface " + options.iface);
    context_ = std::move(context);
    ShmOptions shm_options{.timeout = options.timeout, .staging_bytes = options.shm_staging_bytes};
    shm_ = ShmCollectives::connect(*store_, prefix, rank, size, options.shared_memory, shm_options, &why_not_shm_);
    wait_until_all_connected(*store_, prefix, size, options.timeout);
  } catch (const std::exception& e) {
    LOOM_FAIL("gloo rendezvous of group '", prefix, "' failed on rank ", rank, " of ", size, ": ", e.what(),
              ". Every rank must create this group (same name, same world size) within the timeout (",
              options.timeout.count(), " ms). Across machines, each rank's address (GlooOptions::hostname = '",
              options.hostname, "', iface = '", options.iface, "') must be reachable from the others");
  }
}

Tensor GlooCommunicator::zeros_symmetric(const Shape& shape, TensorOptions options) {
  if (!shm_) why_not_symmetric_ = "collectives go over TCP: " + why_not_shm_;
  else if (options.device_.type != DeviceType::CPU)
    why_not_symmetric_ = "symmetric memory is host memory; CUDA tensors go through host copies";
  else {
    why_not_symmetric_.clear();
    return shm_->zeros_symmetric(*store_, prefix_, shape, options, &why_not_symmetric_);
  }
  return Communicator::zeros_symmetric(shape, options);
}

bool GlooCommunicator::is_symmetric(const Tensor& tensor) const { return shm_ && shm_->is_symmetric(tensor); }

void GlooCommunicator::copy_one_sided(std::vector<Tensor>& out, const Tensor& in) {
  shm_->all_gather_one_sided(out, in);  // is_symmetric(in) was checked: shm_ exists
}

// Note [Destroying a communicator with work in flight]
// Normally every Work has been waited for and destruction just closes the connections.
// If not (an exception unwound past the waits), queued collectives fail without
// running, posted point-to-point ops are aborted, and the one collective that may be
// running is left to finish or reach its deadline: interrupting Gloo mid-collective
// from another thread is not something its API supports.
GlooCommunicator::~GlooCommunicator() {
  queue_.close("the communicator was destroyed before this operation started");
  reap_finished_peer_ops(/*all=*/true);
}

std::shared_ptr<Work> GlooCommunicator::launch(Op op) {
  // op.list was checked to match op.tensor's dtype and device (communicator.cpp).
  if (const Tensor& t = op.tensor; t.defined()) {
    LOOM_CHECK(t.device().is_cpu() || (t.device().is_cuda() && !is_point_to_point(op.kind)), op.describe(),
               ": the gloo backend moves CPU tensors, and CUDA tensors in collectives (through the host), got one "
               "on ", t.device(), ". Use the nccl backend for CUDA send/recv, or move the tensor with .to(\"cpu\")");
    // See Note [Which dtypes the gloo backend reduces] (host_reduce.h); the others move bytes.
    const bool reduces = op.kind == OpKind::AllReduce || op.kind == OpKind::ReduceScatter;
    LOOM_CHECK(!reduces || is_reducible(t.dtype()), op.describe(), ": the gloo backend reduces ",
               reducible_dtype_names(), " tensors, got ", dtype_name(t.dtype()), "; convert with .to(kFloat32)");
  }
  auto work = std::make_shared<Work>(op.describe());
  if (is_point_to_point(op.kind)) return launch_point_to_point(std::move(op), std::move(work));
  if (needs_host_staging(op)) {  // See Note [CUDA tensors through gloo] (host_staging.h).
    auto staged = std::make_shared<HostStaged>(stage_on_host(op));
    queue_.push(work, [this, staged, caller = work.get()] {  // the queue holds the Work while this runs
      run_collective(staged->op, caller);
      copy_results_back(*staged);
    });
    return work;
  }
  queue_.push(work, [this, op = std::move(op), caller = work.get()] { run_collective(op, caller); });
  return work;
}

void GlooCommunicator::mark_broken(const std::string& why) {
  std::lock_guard<std::mutex> lock(broken_mutex_);
  if (broken_.empty()) broken_ = why;
}

void GlooCommunicator::throw_if_broken(const Op& op) const {
  std::lock_guard<std::mutex> lock(broken_mutex_);
  LOOM_CHECK(broken_.empty(), op.describe(), " was not run: this communicator failed earlier and cannot be used "
             "any more. Destroy it and create a new group on every rank. The first failure was: ", broken_);
}

void GlooCommunicator::fail(const Op& op, const std::exception& gloo_error) {
  std::string what = gloo_error.what();
  std::string hint;
  if (what.find("imed out") != std::string::npos || what.find("imeout") != std::string::npos)
    hint = detail::str("timed out after ", timeout().count(), " ms. Another rank did not reach this operation in "
                       "time: it may have crashed, be stuck or slower than the timeout, or be calling operations "
                       "in a different order. Check the other ranks' output");
  else if (what.find("losed") != std::string::npos || what.find("reset") != std::string::npos)
    hint = "A peer closed its connection: its process exited or crashed, or an operation failed there (a rank "
           "whose operation fails closes its connections). Check the other ranks' output";
  else
    hint = "Check the other ranks' output for the first error";
  std::string message = detail::str(op.describe(), " failed: ", hint, ". [gloo: ", what, "]");
  bool first_failure;
  {
    std::lock_guard<std::mutex> lock(broken_mutex_);
    first_failure = broken_.empty();
  }
  // Which peers are gone: see Note [A roll call after a failure] (roll_call.h). A few
  // seconds at most, a quarter of the timeout on short ones. Closing the connections
  // first fails at once every peer that waits on this rank, so that it answers too.
  const auto wait = std::clamp(timeout() / 4, milliseconds(100), milliseconds(3000));
  if (first_failure && size() > 1) {
    try {
      context_->closeConnections();
    } catch (const std::exception&) {
    }
    message += ". " + roll_call(store_->host(), store_->port(), prefix_, rank(), size(), op.describe(), wait);
  }
  mark_broken(message);
  LOOM_FAIL(message, ". This communicator cannot be used any more");
}

// ---- collectives, on the worker thread ------------------------------------------------

static milliseconds until(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
  return std::max(left, milliseconds(1));
}

void GlooCommunicator::exchange_fingerprints(const Op& op, uint32_t tag, Clock::time_point deadline) {
  Fingerprint mine = fingerprint(op);
  std::vector<Fingerprint> all(size());
  try {
    gloo::AllgatherOptions opts(context_);
    opts.setInput(mine.words.data(), mine.words.size());
    opts.setOutput(all[0].words.data(), all.size() * mine.words.size());
    opts.setTag(tag);
    opts.setTimeout(until(deadline));
    gloo::allgather(opts);
  } catch (const std::exception& e) {
    fail(op, e);
  }
  check_same_collective(all, op);  // a clean error on every rank; see Note [Why a fingerprint ...]
}

void GlooCommunicator::run_collective(const Op& op, Work* caller) {
  throw_if_broken(op);
  const auto deadline = Clock::now() + timeout();
  if (shm_) return shm_->run(op, deadline, caller);
  const auto tag = static_cast<uint32_t>(op.seq * 2);  // fingerprint: 2n, data: 2n + 1
  if (verify_collectives_) exchange_fingerprints(op, tag, deadline);
  const Tensor& t = op.tensor;
  const size_t nbytes = t.defined() ? t.nbytes() : 0;
  try {
    switch (op.kind) {
      case OpKind::AllReduce: run_all_reduce(t, op.reduce, tag + 1, deadline); break;
      case OpKind::Broadcast: {
        if (nbytes == 0) break;
        gloo::BroadcastOptions opts(context_);
        opts.setOutput(static_cast<uint8_t*>(t.raw_data()), nbytes);  // bytes: no arithmetic, any dtype
        opts.setRoot(op.peer);
        opts.setTag(tag + 1);
        opts.setTimeout(until(deadline));
        gloo::broadcast(opts);
        break;
      }
      case OpKind::AllGather: {
        if (nbytes == 0) break;
        std::vector<uint8_t> gathered(nbytes * size());
        gloo::AllgatherOptions opts(context_);
        opts.setInput(static_cast<uint8_t*>(t.raw_data()), nbytes);
        opts.setOutput(gathered.data(), gathered.size());
        opts.setTag(tag + 1);
        opts.setTimeout(until(deadline));
        gloo::allgather(opts);
        for (int r = 0; r < size(); ++r) std::memcpy(op.list[r].raw_data(), gathered.data() + r * nbytes, nbytes);
        break;
      }
      case OpKind::ReduceScatter: run_reduce_scatter(op, tag + 1, deadline); break;
      case OpKind::Barrier: {
        gloo::BarrierOptions opts(context_);
        opts.setTag(tag + 1);
        opts.setTimeout(until(deadline));
        gloo::barrier(opts);
        break;
      }
      default: LOOM_FAIL(op.describe(), ": not a collective");
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    fail(op, e);
  }
}

}  // namespace loom::distributed
