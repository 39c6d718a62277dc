// GlooCommunicator: the CPU backend, over Gloo's TCP transport.
//
//   auto store = std::make_shared<TCPStore>("127.0.0.1", 29500, rank == 0);
//   GlooCommunicator comm(store, "my_group", rank, world_size);  // blocks until all ranks joined
//   comm.all_reduce(t)->wait();
//
// Construction is the rendezvous: every rank publishes its Gloo address in the store
// (under `prefix`) and connects to every other rank (a full mesh of TCP pairs).
// Collectives run on the communicator's worker thread (see Note [One worker thread per
// communicator] in op_queue.h), each preceded by a fingerprint check (Note [Why a
// fingerprint before every collective] in op.h). Point-to-point ops are posted to Gloo
// at once from the calling thread; see Note [Point-to-point in Gloo] in gloo_p2p.cpp.
//
// Same host: when every rank runs on one machine, collectives go through a shared-memory
// segment instead of TCP (parallel/comm/shm_collectives.h; like NCCL, which picks its
// SHM transport by itself). Point-to-point ops always use Gloo. GlooOptions::
// shared_memory = false (LOOM_GLOO_SHM=0 for init_process_group) forces TCP.
//
// Tensors: contiguous, float32 / float64 / int32 / int64; on the CPU, or CUDA tensors in
// collectives, which go through host copies (Note [CUDA tensors through gloo],
// host_staging.h), as with PyTorch's gloo backend.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "parallel/comm/communicator.h"
#include "parallel/comm/op_queue.h"
#include "parallel/comm/shm_collectives.h"
#include "parallel/store/tcp_store.h"

namespace gloo {
class Context;
}

namespace loom::distributed {

struct GlooOptions {
  std::chrono::milliseconds timeout = kDefaultCommTimeout;
  // The address this rank's Gloo device listens on, published to the other ranks: they
  // must be able to reach it. 127.0.0.1 is right for one machine; across machines use
  // this machine's hostname or IP, or name a network interface in `iface` (as PyTorch's
  // GLOO_SOCKET_IFNAME).
  std::string hostname = "127.0.0.1";
  std::string iface;
  // The fingerprint check before every collective (Note [Why a fingerprint before every
  // collective] in op.h). Turning it off saves one small message round per collective;
  // a shape mismatch may then abort a process or hang until the timeout.
  bool verify_collectives = true;
  // Collectives through shared memory when every rank is on this host (see above).
  // Every rank must agree to; otherwise all use TCP. The fingerprint check is always on
  // there: it rides along with the first phase of each collective, for free.
  bool shared_memory = true;
  size_t shm_staging_bytes = size_t(4) << 20;  // ShmOptions::staging_bytes
};

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<TCPStore> store, const std::string& prefix, int rank, int size,
                   GlooOptions options = {});
  ~GlooCommunicator() override;

  const char* backend() const override { return "gloo"; }
  // How collectives travel: "shm" (one host) or "tcp".
  const char* collective_transport() const { return shm_ ? "shm" : "tcp"; }
  // See ShmCollectives::chunks_reduced; 0 over TCP.
  int64_t symmetric_chunks_reduced() const { return shm_ ? shm_->chunks_reduced() : 0; }
  // Why collectives use TCP ("" when they use shared memory).
  const std::string& why_not_shared_memory() const { return why_not_shm_; }

  // CPU tensors in the shared-memory segment when collectives go through it (Note
  // [Symmetric memory]); plain zeros over TCP or when the segment cannot be made.
  Tensor zeros_symmetric(const Shape& shape, TensorOptions options) override;
  // Why the last zeros_symmetric returned plain zeros ("" when it did not).
  const std::string& why_not_symmetric() const { return why_not_symmetric_; }
  bool is_symmetric(const Tensor& tensor) const override;

 protected:
  void copy_one_sided(std::vector<Tensor>& out, const Tensor& in) override;

 public:

 protected:
  std::shared_ptr<Work> launch(Op op) override;

 private:
  struct PeerOp;  // a posted send or recv; gloo_p2p.cpp

  // Collectives, on the worker thread (gloo_communicator.cpp).
  // `caller`: the operation's Work, which the shared-memory transport watches (Note
  // [Whoever waits reduces], shm_collectives.h).
  void run_collective(const Op& op, Work* caller);
  void exchange_fingerprints(const Op& op, uint32_t tag, std::chrono::steady_clock::time_point deadline);
  // Reductions over TCP (gloo_reduce_shares.cpp, Note [A rank-ordered all_reduce over TCP]).
  void run_all_reduce(const Tensor& tensor, ReduceOp op, uint32_t tag, std::chrono::steady_clock::time_point deadline);
  void run_reduce_scatter(const Op& op, uint32_t tag, std::chrono::steady_clock::time_point deadline);
  void reduce_shares(uint8_t* data, DType dtype, const std::vector<size_t>& bounds, ReduceOp op, uint32_t tag,
                     std::chrono::steady_clock::time_point deadline, bool gather);
  // Point-to-point, posted from the caller (gloo_p2p.cpp).
  std::shared_ptr<Work> launch_point_to_point(Op op, std::shared_ptr<Work> work);
  void finish_point_to_point(PeerOp& p);
  void reap_finished_peer_ops(bool all);

  // A Gloo failure leaves the connections in an unknown state; see Note [Nothing hangs
  // forever] in communicator.h. Records the first one; later ops fail naming it.
  void mark_broken(const std::string& why);
  void throw_if_broken(const Op& op) const;
  [[noreturn]] void fail(const Op& op, const std::exception& gloo_error);

  std::shared_ptr<TCPStore> store_;
  std::string prefix_;
  bool verify_collectives_;
  std::shared_ptr<gloo::Context> context_;
  std::unique_ptr<ShmCollectives> shm_;  // null: collectives over Gloo's TCP
  std::string why_not_shm_;
  std::string why_not_symmetric_;

  mutable std::mutex broken_mutex_;
  std::string broken_;  // empty while healthy

  std::mutex peer_ops_mutex_;
  std::vector<std::shared_ptr<PeerOp>> peer_ops_;  // posted and not yet reaped

  OpQueue queue_;  // last member: its destructor joins the worker before the rest goes
};

}  // namespace loom::distributed
