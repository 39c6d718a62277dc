// Communicator: a fixed group of ranks that exchange tensors, one backend per kind of
// device (Gloo for CPU tensors, NCCL for CUDA tensors).
//
//   std::shared_ptr<Communicator> comm = ...;       // usually via init_process_group
//   auto work = comm->all_reduce(grad, ReduceOp::Avg);
//   ...                                              // compute overlaps the transfer
//   work->wait();                                    // grad holds the average now
//
// Semantics follow torch.distributed: all_reduce / broadcast work in place;
// all_gather fills a list of world-size tensors; reduce_scatter reduces a list of
// world-size tensors and keeps this rank's share; send/recv move one tensor between two
// ranks, matched by (peer, tag) in call order. A send completes once the receiver has
// posted its recv (as MPI's synchronous send): when two ranks exchange, both post send
// and recv before waiting on either. Every call returns at once with a Work
// (see work.h); operations of one communicator run in the order they were called.
// Tensor is a handle, so tensors are taken by const& and their data is what changes.
//
// Note [Nothing hangs forever]
// Every operation has a deadline: timeout() after it starts (300 s by default, as
// PyTorch). When it passes, the operation fails with an error that names the operation,
// its number, the tensor and this rank, and the communicator becomes unusable (its
// connections may hold half-sent data); later operations fail at once, naming the
// first failure. Recreate the group on every rank to go on. Because each operation
// ends by its deadline, Work::wait() needs no timeout of its own.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "parallel/comm/op.h"       // defines: ReduceOp, Op, OpKind
#include "parallel/comm/traffic.h"  // defines: Traffic, TrafficCounter, process_traffic
#include "parallel/comm/work.h"     // defines: Work

namespace loom::distributed {

constexpr std::chrono::milliseconds kDefaultCommTimeout = std::chrono::seconds(300);

class Communicator {
 public:
  Communicator(int rank, int size, std::chrono::milliseconds timeout);
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // rank() is -1 on a rank that is not a member of the group (new_group gives such ranks a
  // handle whose operations are errors, as PyTorch's GroupMember.NON_GROUP_MEMBER).
  int rank() const { return rank_; }
  int size() const { return size_; }
  bool is_member() const { return rank_ >= 0; }
  // The name new_group gave this group ("" for the default group and hand-made ones);
  // errors about membership name it.
  const std::string& group_name() const { return group_name_; }
  void set_group_name(std::string name) { group_name_ = std::move(name); }
  std::chrono::milliseconds timeout() const { return timeout_; }
  virtual const char* backend() const = 0;  // "gloo", "nccl"
  // The device of the tensors this backend moves: cpu for gloo, the rank's GPU for nccl.
  // Small tensors a caller makes on the host to communicate (shapes, counts, metrics)
  // go there first; see to_communication_device below.
  virtual Device tensor_device() const { return Device(DeviceType::CPU); }

  // tensor <- op over every rank's tensor.
  std::shared_ptr<Work> all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::Sum);
  // tensor <- root's tensor.
  std::shared_ptr<Work> broadcast(const Tensor& tensor, int root);
  // out[r] <- rank r's `in`. An empty `out` is filled with new tensors shaped like `in`;
  // otherwise it must hold size() contiguous tensors of in's dtype and shape.
  std::shared_ptr<Work> all_gather(std::vector<Tensor>& out, const Tensor& in);
  // The same result without the other ranks taking part, on the calling thread, at once:
  // `in` must lie in symmetric memory (is_symmetric), and the caller guarantees every
  // rank's `in` holds its final values and keeps them until every rank's copy is done.
  // See Note [One-sided all_gather].
  void all_gather_one_sided(std::vector<Tensor>& out, const Tensor& in);
  // out <- op over ranks r of r's in[rank()]. `in` holds size() tensors shaped like out.
  std::shared_ptr<Work> reduce_scatter(const Tensor& out, const std::vector<Tensor>& in,
                                       ReduceOp op = ReduceOp::Sum);
  // Point-to-point. The receiver's tensor must match the sender's dtype and shape.
  std::shared_ptr<Work> send(const Tensor& tensor, int dst, int tag = 0);
  std::shared_ptr<Work> recv(const Tensor& tensor, int src, int tag = 0);
  // Completes once every rank has called it.
  std::shared_ptr<Work> barrier();

  // A zero-filled tensor every rank allocates together, in memory the backend can reach
  // from every rank; all_reduce of a tensor in it (or of a contiguous slice of it at the
  // same place on every rank) skips the copy into the transport. See Note [Symmetric
  // memory]. A collective: every rank calls it, in the same order, with the same shape
  // and options. Backends without such memory, and groups whose ranks cannot share it,
  // return plain zeros(shape, options), which every operation accepts as usual.
  virtual Tensor zeros_symmetric(const Shape& shape, TensorOptions options);
  // Whether `tensor` lies in symmetric memory this group's ranks can all read (a
  // contiguous piece of a zeros_symmetric tensor on a backend that has such memory).
  virtual bool is_symmetric(const Tensor& tensor) const;

  // What this communicator's collectives moved on this rank, per kind, since it was made
  // or reset_traffic(): see Note [Bytes a collective moves] (traffic.h). Every call is
  // counted where it is issued, below the backends, so every backend counts alike.
  // process_traffic() sums every communicator of the process.
  Traffic traffic() const { return traffic_.snapshot(); }
  void reset_traffic() { traffic_.reset(); }

 protected:
  // The backend's half: `op` has been checked against everything that does not depend
  // on the backend (ranks, list lengths, shapes, contiguity) and numbered; launch
  // starts it and returns its Work. Called in issue order, under a lock, so a backend
  // that queues ops keeps the numbering order.
  virtual std::shared_ptr<Work> launch(Op op) = 0;
  // all_gather_one_sided's copies, `in` checked to be symmetric (backends with symmetric memory).
  virtual void copy_one_sided(std::vector<Tensor>& out, const Tensor& in);

 private:
  std::shared_ptr<Work> issue(Op op);
  void check_all_gather(std::vector<Tensor>& out, const Tensor& in, const char* name) const;
  // A loom::Error when this rank is not a member of the group (see rank()).
  void check_member(const char* op) const;

  const int rank_;
  const int size_;
  const std::chrono::milliseconds timeout_;
  std::string group_name_;
  std::mutex issue_mutex_;  // numbering and launching are one step
  uint64_t collective_seq_ = 0;
  uint64_t p2p_seq_ = 0;
  TrafficCounter traffic_;
};

// Note [Symmetric memory]
// An all_reduce through shared memory copies each rank's tensor into the segment,
// reduces there and copies the result back: for DDP's gradient buckets (43 MiB per
// ResNet18 step) the copy in is a third of the communicator's memory traffic, and on a
// machine whose cores all run training, every byte of it is taken from training. When the
// bucket itself lives in the segment, each rank reduces its share straight from every
// rank's bucket and copies the others' reduced shares: no copy in, no copy out of a
// staging area. Such memory is allocated by every rank together, at the same offset
// on every rank, which is what PyTorch calls symmetric memory
// (torch.distributed._symmetric_memory.empty, NCCL's ncclMemAlloc + window
// registration). Whether a collective takes the symmetric path is checked across ranks
// before any data moves (a rank whose tensor is elsewhere gets a clear error, not a
// silent mix of the two algorithms).

// Note [One-sided all_gather]
// An all_gather from symmetric memory needs no other rank to do anything: every rank's
// piece is already mapped here, so a rank can copy them all whenever it likes, as
// NVSHMEM's get or PyTorch's SymmetricMemory buffers allow. What it cannot know is
// whether a piece is final, or whether its owner is about to rewrite it; ordinary
// collectives answer that by synchronising (Note [Symmetric all_gather]), at every
// call. all_gather_one_sided leaves it to the caller's protocol instead, which can
// synchronise once for many gathers. FSDP does: its shards change only in optimizer
// steps and checkpoint loads, and it gathers every unit once or twice between two of
// them (Note [When one-sided gathers may read], parallel/fsdp/runtime.cpp). The copies
// run on the calling thread, at once: there is nobody to wait for, so there is nothing
// to queue behind (a collective ahead in the communicator's queue, waiting for a slow
// rank, would otherwise hold the gather up).

// Note [Metadata tensors travel on the communicator's device]
// NCCL moves only CUDA tensors, so a shape table or a metric sum made with from_vector
// (a CPU tensor) cannot be all-gathered or all-reduced as it is. Code that communicates
// such host-made values, whatever the backend, puts them on comm.tensor_device() first
// and reads them back with tolist() (which copies to the host after the operation, as
// the current stream orders it). PyTorch does the same for its object collectives
// (_get_pg_default_device).
Tensor to_communication_device(const Tensor& host, const Communicator& comm);

}  // namespace loom::distributed
