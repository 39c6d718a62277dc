// ShmCollectives: the collectives of ranks that share one host, through one POSIX
// shared-memory segment instead of TCP (what NCCL's SHM transport does for GPUs).
//
//   // inside GlooCommunicator's constructor, on every rank:
//   std::string why_not;
//   auto shm = ShmCollectives::connect(store, prefix, rank, size, options, &why_not);
//   if (shm) shm->run(op, deadline);   // on the worker thread: all_reduce, broadcast, ...
//   else ...                           // another host, or disabled: Gloo's TCP
//
// Why: over loopback TCP every byte of an all_reduce is copied into the kernel, out of
// it, and reduced, on both ranks, by the communicator's thread and Gloo's I/O thread
// (~65 ms of CPU per ResNet18 step on this project's 2-core machine, taken from the
// training threads). Through shared memory a rank copies its data in once, reduces
// 1/world of it, and copies the others' reduced shares out: about 2.5 bytes of memory
// traffic per byte instead of ~10, and no system calls but futex wake-ups.
//
// Layout of the segment (see Note [Two of everything] for why "two"):
//
//   header | rank 0 control | rank 1 control | ... | rank 0 staging: half 0, half 1 | rank 1 staging ...
//
// A rank's control block holds its phase counter (the futex word its peers wait on),
// its pid, and its fingerprints; its staging area is where its data goes in.
//
// Note [Rounds and phases]
// A collective runs as rounds (one per chunk of at most one staging half), each of one
// or two synchronisation points (phases). At a phase a rank publishes that it is done
// with what came before by bumping its phase counter (release), and waits until every
// peer's counter has reached the same value (acquire). Every rank runs the same
// sequence of rounds and phases (ranks agree on the collective: the fingerprints of
// round 0 say so), so equal counters mean "the same point of the same collective". An
// all_reduce round is: copy my chunk in | phase | reduce my 1/world share of the chunk
// in place | phase | copy every rank's reduced share out. Each share is reduced by
// exactly one rank, always in rank order, so every rank ends with bitwise identical
// values (and the same bits as the symmetric algorithm below).
//
// Note [Two of everything]
// A fast rank may start round c+1 while a slow one still copies reduced shares out of
// round c. So staging halves (and fingerprint slots) alternate by round parity: a rank
// writes round c+2's data into the half round c used only after passing round c+1's
// first phase, which every peer reaches only after it has finished reading round c.
// No phase at the end of a collective is needed, and none at the start.
//
// Note [Waiting without burning a core]
// The training threads already use every core. A waiting communicator thread spins a
// few microseconds (a peer is often just about to arrive), then sleeps in futex_wait on
// the peer's counter; the peer's futex_wake after each bump wakes it. Sleeps are cut
// into 100 ms slices to check the deadline, whether a peer gave up (it sets `failed` in
// the header), and whether its process still exists: a dead peer is an error within
// 100 ms naming its rank, the operation and the step, never a hang. See Note [Nothing
// hangs forever] in communicator.h.
//
// Note [Whoever waits reduces]
// A tensor in symmetric memory (Note [Symmetric memory], communicator.h) is reduced in
// place: 64 KiB chunks, each read from every rank's block and its sum written back into
// every block, by whichever rank takes it from a counter in the header. Who takes
// chunks is what makes it fast in DDP. There every core trains, and the communicator
// thread's CPU is taken from the training thread of its own rank. The ranks that arrive
// at an all_reduce first are ahead, and will wait for the others at the end of the step
// anyway; the rank that arrives last is the slowest, and everyone waits for it. So the
// last to arrive (by the arrival times all ranks stamp, the same answer on every rank)
// leaves the chunks to the others and sleeps, unless its caller blocks in Work::wait
// (then its core is free: Work::on_awaited wakes it, and it joins in). On this
// project's 2-core VM, whose cores' speeds drift apart by a few percent (at times by
// 20%), the faster rank reduced 86% of ResNet18's gradients in a 20-step run, and the
// two ranks' backward passes ended together (docs/ddp.md). The chunks' results are written where they will be read (every block),
// so no copy-out phase is needed: 2 bytes of memory traffic per gradient byte and rank
// instead of 2.5, one synchronisation less. There is always at least one rank that is
// not last, so every chunk gets taken even if nobody waits.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "parallel/comm/op.h"
#include "parallel/comm/shm_segment.h"
#include "parallel/comm/work.h"
#include "parallel/store/tcp_store.h"

namespace loom::distributed {

struct ShmOptions {
  std::chrono::milliseconds timeout{300000};
  // Bytes of one staging half per rank (Note [Two of everything]): a collective moves
  // data in chunks of this size. Larger chunks mean fewer phases; 4 MiB already makes
  // their cost negligible. Tests make it tiny to exercise chunking.
  size_t staging_bytes = size_t(4) << 20;
};

class ShmCollectives {
 public:
  using Deadline = std::chrono::steady_clock::time_point;

  // Collective over the store (every rank calls it with the same prefix): if every rank
  // wants shared memory (`wanted`) and all of them run on one host, rank 0 creates the
  // segment and every rank maps it. Otherwise, or when the segment cannot be made
  // (/dev/shm too small, separate containers), returns null on every rank and says why
  // in *why_not: the caller then goes over TCP. Store timeouts throw.
  static std::unique_ptr<ShmCollectives> connect(TCPStore& store, const std::string& prefix, int rank, int size,
                                                 bool wanted, ShmOptions options, std::string* why_not);
  ShmCollectives(const ShmCollectives&) = delete;
  ShmCollectives& operator=(const ShmCollectives&) = delete;

  // Runs collective `op` (not send/recv) to completion; from one thread at a time.
  // Throws loom::Error: ranks that disagree about the collective (nothing moved, still
  // usable), or a peer that timed out, died or failed (then unusable, see Note [Nothing
  // hangs forever] in communicator.h).
  // `caller`, the operation's Work, if any: see Note [Whoever waits reduces].
  void run(const Op& op, Deadline deadline, Work* caller = nullptr);

  // Note [Symmetric memory] (communicator.h): every rank calls this together, with the
  // same shape and dtype; each gets a zero-filled tensor in a segment they all map. An
  // all_reduce or all_gather of a tensor in it then skips the staging copies
  // (shm_symmetric.cpp; Note [Symmetric all_gather] in shm_collectives.cpp). When
  // the segment cannot be made or mapped, every rank gets plain zeros and *why_not says
  // why. A collective over the store, not through the communicator's queue.
  Tensor zeros_symmetric(TCPStore& store, const std::string& prefix, const Shape& shape, TensorOptions options,
                         std::string* why_not);

  // Whether `tensor` is a contiguous piece of a zeros_symmetric allocation. Any thread.
  bool is_symmetric(const Tensor& tensor) { return find_symmetric(tensor).id >= 0; }
  // out[p] <- rank p's `in`, read where it lies, on the calling thread: Note [One-sided
  // all_gather] (communicator.h). Any thread.
  void all_gather_one_sided(std::vector<Tensor>& out, const Tensor& in);

  // Chunks of symmetric all_reduces this rank has reduced so far (Note [Whoever waits
  // reduces]): who did the work. Read on any thread.
  int64_t chunks_reduced() const { return chunks_reduced_.load(std::memory_order_relaxed); }

 private:
  ShmCollectives(SharedMemorySegment segment, int rank, int size, ShmOptions options);
  static SharedMemorySegment share_segment(TCPStore& store, const std::string& key, int rank, int size, size_t bytes,
                                           const std::string& name_tag, std::chrono::milliseconds timeout,
                                           std::string refusal, const std::function<void(void*)>& on_mapped,
                                           std::string* why_not);

  // Where a tensor lies in symmetric memory: allocation `id`, whose rank-p block starts
  // at base + p * stride, at byte `offset` of it. `segment` keeps the mapping alive
  // while a collective runs.
  struct SymmetricPlace {
    std::shared_ptr<SharedMemorySegment> segment;
    uint8_t* base = nullptr;
    size_t stride = 0;
    int64_t id = -1;  // -1: not in symmetric memory
    int64_t offset = -1;
    uint8_t* block(int rank) const { return base + size_t(rank) * stride + size_t(offset); }
  };
  SymmetricPlace find_symmetric(const Tensor& tensor);
  void all_reduce_symmetric(const Op& op, Deadline deadline, const SymmetricPlace& place, Work* caller);
  void all_gather_symmetric(const Op& op, Deadline deadline, const SymmetricPlace& place);
  int last_to_arrive(uint64_t round) const;
  // Takes the next unclaimed chunk before `end`, if any (Note [Whoever waits reduces]).
  bool claim_chunk(uint64_t end, uint64_t* chunk);

  struct Header;
  struct RankControl;
  Header& header() const;
  RankControl& control(int rank) const;
  uint8_t* staging(int rank, uint64_t round) const;  // the half of `round`

  void all_reduce(const Op& op, Deadline deadline, Work* caller);
  void broadcast(const Op& op, Deadline deadline);
  void all_gather(const Op& op, Deadline deadline);
  void reduce_scatter(const Op& op, Deadline deadline);
  void barrier(const Op& op, Deadline deadline);

  // Round 0 of every collective: my fingerprint goes with my first phase; after it,
  // every rank checks everyone's (Note [Why a fingerprint before every collective]).
  // `place` travels with it: ranks must agree on whether (and where) the tensor lies in
  // symmetric memory, which decides the algorithm.
  void publish_fingerprint(const Op& op, uint64_t round, int64_t symmetric_id = -1, int64_t symmetric_offset = -1);
  void check_fingerprints(const Op& op, uint64_t round) const;
  // One phase (Note [Rounds and phases]): bump my counter, wake waiters, wait for all.
  // `step` names what the peers are waited for, for messages.
  void phase(const Op& op, Deadline deadline, const std::string& step);
  // Waits until `word` reaches `target`, set by `peer` (-1: any rank), or until
  // `unless` says to stop waiting (checked when woken); fails on the deadline, a peer
  // that gave up or a peer process that exited.
  void wait_until(std::atomic<uint32_t>& word, uint32_t target, int peer, const Op& op, Deadline deadline,
                  const std::string& step, const std::function<bool()>& unless = nullptr);
  [[noreturn]] void fail(const Op& op, const std::string& why);

  SharedMemorySegment segment_;
  const int rank_;
  const int size_;
  const ShmOptions options_;
  size_t half_bytes_ = 0;
  size_t staging_offset_ = 0;
  uint32_t phase_ = 0;   // my phases so far (mirrors my counter in the segment)
  uint64_t round_ = 0;   // my rounds so far; its parity picks the staging half
  uint64_t chunk_base_ = 0;  // symmetric all_reduce chunks so far, the same on every rank
  std::atomic<int64_t> chunks_reduced_{0};
  std::string broken_;   // the first failure; empty while usable

  // Symmetric allocations, registered by zeros_symmetric (the caller's thread) and
  // looked up by all_reduce (the communicator's thread).
  struct SymmetricRegion {
    std::weak_ptr<SharedMemorySegment> segment;  // the tensors own it
    uint8_t* base;
    size_t stride;
    int64_t id;
  };
  std::mutex symmetric_mutex_;
  std::vector<SymmetricRegion> symmetric_;
  int64_t symmetric_allocations_ = 0;  // on the caller's thread only
};

}  // namespace loom::distributed
