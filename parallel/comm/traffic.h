// Traffic: how many collectives of each kind a communicator issued, and how many bytes
// they moved on this rank, counted the way NCCL's nccl-tests count bus bandwidth.
//
//   auto before = distributed::process_traffic();      // every communicator of this process
//   train_one_step();
//   auto step = distributed::process_traffic() - before;
//   step.all_reduce.bytes;                             // DDP: 2(N-1)/N * 4 * parameters
//   std::cout << traffic_json(step);                   // {"all_reduce": 359, "all_gather": 0, ...}
//   comm.traffic(), comm.reset_traffic();              // one communicator's own counts
//
// Why bytes and not seconds: on a laptop running four ranks on two cores, a step's time
// says more about the machine than about the parallel mode. The bytes each collective
// moves per step do not depend on the machine, so each mode's traffic can be set
// against its formula anywhere (docs/communication.md has the formulas and a table).
//
// Note [Bytes a collective moves]
// For a collective over N ranks of a buffer of S bytes, nccl-tests (doc/PERFORMANCE.md)
// call S/t the algorithm bandwidth and scale it by what each rank must send (and
// receive) at least, whatever the algorithm, to get the bus bandwidth. loom counts those
// bus bytes, per rank and per call:
//
//   kind            S, the payload                        bytes this rank moves
//   all_reduce      the tensor                            2(N-1)/N * S   (reduce-scatter + all-gather)
//   all_gather      the gathered whole: N * the input     (N-1)/N * S    (every shard but its own)
//   reduce_scatter  the whole before: N * the output      (N-1)/N * S
//   broadcast       the tensor                            S
//   send, recv      the tensor                            S
//   barrier         -                                     0 (calls only)
//
// A ring all_reduce of S bytes, for instance, passes N-1 chunks of S/N round the ring to
// reduce and N-1 more to spread the result: 2(N-1)/N * S out of every rank, the
// number counted here whatever the backend really does (Gloo's rings, the shared-memory
// segment, NCCL's trees). all_reduce's bytes are rounded to the nearest byte per call
// (2(N-1)S/N is a fraction for odd N); the others are whole numbers. A group of one
// rank moves nothing, so its broadcasts count 0 bytes (nccl-tests, timing copies, count
// S there). all_gather_one_sided (Note [One-sided all_gather], communicator.h) reads
// N-1 shards from its peers as an all_gather would, and counts as one all_gather.
//
// Both numbers are kept: `bytes` for the formulas above, `payload_bytes` (S) for the
// data the caller handed over. They are counted when the collective is issued
// (Communicator::issue, one place for every backend), not when it completes.
//
// Note [Traffic counters are relaxed atomics]
// Collectives are issued from training threads, DDP's gradient hooks and FSDP's
// prefetches, sometimes at once; a counter is a handful of relaxed fetch_adds, so
// counting costs nothing next to a collective. A snapshot read while collectives are
// issued may mix a call's count with the previous call's bytes; read between steps (as
// a trainer does) it is exact.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

#include "parallel/comm/op.h"  // defines: OpKind

namespace loom::distributed {

// One kind of collective: calls and bytes, as Note [Bytes a collective moves] defines them.
struct KindTraffic {
  int64_t calls = 0;
  int64_t bytes = 0;          // moved by this rank (nccl-tests' bus bytes)
  int64_t payload_bytes = 0;  // S: the buffer the collective is about

  bool operator==(const KindTraffic&) const = default;
};

// A snapshot of the counts, per kind, named as the Communicator methods.
struct Traffic {
  KindTraffic all_reduce, all_gather, reduce_scatter, broadcast, send, recv, barrier;

  KindTraffic& operator[](OpKind kind);
  const KindTraffic& operator[](OpKind kind) const;
  int64_t total_bytes() const;  // every kind's bytes
  int64_t total_calls() const;
  // The traffic between two snapshots (`after - before`), and sums of them.
  Traffic operator-(const Traffic& before) const;
  Traffic& operator+=(const Traffic& other);
  bool operator==(const Traffic&) const = default;

  // "all_reduce: 3 calls, 1.2 MB (payload 0.9 MB); broadcast: 1 call, 40 B; ..." (kinds
  // never called are left out; "no communication" when none was).
  std::string str() const;
};

// The kinds in the order str() and traffic_json() print them.
inline constexpr std::array<OpKind, 7> kTrafficKinds = {OpKind::AllReduce, OpKind::AllGather, OpKind::ReduceScatter,
                                                        OpKind::Broadcast, OpKind::Send,      OpKind::Recv,
                                                        OpKind::Barrier};

// The bytes a rank of a group of `group_size` moves for one collective of `kind` whose
// payload is `payload_bytes`. See Note [Bytes a collective moves].
int64_t bus_bytes(OpKind kind, int64_t payload_bytes, int group_size);

// The counters behind Traffic; see Note [Traffic counters are relaxed atomics].
class TrafficCounter {
 public:
  void add(OpKind kind, int64_t bytes, int64_t payload_bytes);
  Traffic snapshot() const;
  void reset();

 private:
  struct Slot {
    std::atomic<int64_t> calls{0}, bytes{0}, payload_bytes{0};
  };
  std::array<Slot, 7> slots_;  // indexed by OpKind
};

// The sum over every communicator this process made (the default group, new_group's
// groups, DeviceMesh's), since the process started or reset_process_traffic(). In a
// test whose ranks are threads, that is every rank's traffic together.
Traffic process_traffic();
void reset_process_traffic();
// Counts one collective on `counter` and on the process-wide total (Communicator does).
void record_traffic(TrafficCounter& counter, OpKind kind, int64_t payload_bytes, int group_size);

// `{"all_reduce": 123, "all_gather": 0, "reduce_scatter": 0, "broadcast": 0, "send": 0,
// "recv": 0}`: each kind's bytes divided by `steps` (rounded to the nearest byte), the
// object a trainer writes as "comm_bytes_per_step". Barriers move no bytes and are left out.
std::string traffic_json(const Traffic& traffic, int64_t steps = 1);

}  // namespace loom::distributed
