// GlooCommunicator's reductions over TCP: all_reduce and reduce_scatter.
//
// Note [A rank-ordered all_reduce over TCP]
// Gloo's own all_reduce is a ring: each element is summed as it travels, starting at a
// rank that depends on where the element lies, so its order of addition differs from
// element to element and from the shared-memory path's (every element in rank order,
// shm_collectives.h). Floating-point sums depend on that order, so on more than two
// ranks a job trained different last bits on one host (shared memory) than across hosts
// (TCP): its weights depended on where its ranks ran. So the TCP path does the
// shared-memory path's arithmetic, in three moves:
//
//     rank r's tensor, cut into N shares:   | s0 | s1 | s2 | s3 |        (N = 4)
//   1. every rank sends share p to rank p, and receives its own share from every peer;
//   2. rank r reduces share r over the N copies in rank order, with host_reduce.h's
//      reduce(), the kernel the shared-memory path runs (Avg divides once, at the end);
//   3. every rank sends its reduced share to every peer (an all-gather).
//
// Each rank sends and receives 2(N-1)/N of the tensor, as in a ring, in two rounds
// rather than 2(N-1) steps; reduce_scatter is moves 1 and 2 alone. Results are bitwise
// those of the shared-memory path for every dtype and world size (16-bit floats are
// rounded once per result in both). And since a rank waits for each peer's data by name,
// a timeout names the peers whose data never came, which Gloo's ring cannot say.
#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <algorithm>
#include <span>
#include <cstring>
#include <stdexcept>

#include "core/error.h"
#include "parallel/comm/gloo_communicator.h"
#include "parallel/comm/host_reduce.h"  // defines: reduce

namespace loom::distributed {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Slot prefixes of moves 1 and 3: neither Gloo's collectives (0x01-0x08) nor loom's
// point-to-point ops (0x40, 0x41, gloo_p2p.cpp) use them.
constexpr uint8_t kScatterSharesSlotPrefix = 0x42;
constexpr uint8_t kGatherSharesSlotPrefix = 0x43;

namespace {

// One posted send or recv. Each has a buffer of its own: Gloo reports the peer of a
// completion only as "the last one", so waits on a buffer shared by several peers could
// not say whose data is missing.
struct Transfer {
  int peer;
  bool send;
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
};

// Waits for every transfer in turn; a timeout or a closed connection names the peer.
void wait_all(std::vector<Transfer>& transfers, Clock::time_point deadline, const char* what) {
  for (Transfer& t : transfers) {
    try {
      const auto left = std::max(std::chrono::duration_cast<milliseconds>(deadline - Clock::now()), milliseconds(1));
      t.send ? t.buffer->waitSend(left) : t.buffer->waitRecv(left);
    } catch (const std::exception& e) {
      throw std::runtime_error(detail::str(e.what(), " (", what, t.send ? " to" : " from", " rank ", t.peer, ")"));
    }
  }
}

}  // namespace

// See Note [A rank-ordered all_reduce over TCP]. `data` holds size() shares, share r being
// elements [bounds[r], bounds[r + 1]); this rank's share ends up reduced in place, and with
// `gather`, every other share too.
void GlooCommunicator::reduce_shares(uint8_t* data, DType dtype, const std::vector<size_t>& bounds, ReduceOp op,
                                     uint32_t tag, Clock::time_point deadline, bool gather) {
  const int me = rank(), n = size();
  const size_t element = element_size(dtype);
  auto bytes = [&](int r) { return (bounds[size_t(r) + 1] - bounds[size_t(r)]) * element; };
  auto share = [&](int r) { return data + bounds[size_t(r)] * element; };
  const size_t mine = bytes(me);
  auto post = [&](std::vector<Transfer>& into, int peer, bool send, uint8_t* at, size_t nbytes, uint64_t slot) {
    if (nbytes == 0) return;
    Transfer t{peer, send, context_->createUnboundBuffer(at, nbytes)};
    send ? t.buffer->send(peer, slot) : t.buffer->recv(peer, slot);
    into.push_back(std::move(t));
  };

  // Moves 1 and 2: my share from every peer (into scratch, one slot per rank), reduced.
  std::vector<uint8_t> scratch(mine * static_cast<size_t>(n));
  std::vector<Transfer> receives, sends;
  const auto scatter_slot = gloo::Slot::build(kScatterSharesSlotPrefix, tag);
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    post(receives, p, false, scratch.data() + size_t(p) * mine, mine, scatter_slot);
    post(sends, p, true, share(p), bytes(p), scatter_slot);
  }
  wait_all(receives, deadline, "share data");
  wait_all(sends, deadline, "share data");
  if (mine > 0) {
    std::vector<const uint8_t*> copies(static_cast<size_t>(n));  // share `me` of every rank, in rank order
    for (int r = 0; r < n; ++r) copies[size_t(r)] = r == me ? share(me) : scratch.data() + size_t(r) * mine;
    uint8_t* const into = share(me);
    reduce(dtype, std::span<uint8_t* const>(&into, 1), copies, mine / element, op, n);
  }
  if (!gather) return;

  // Move 3: every rank's reduced share to every rank.
  receives.clear(), sends.clear();
  const auto gather_slot = gloo::Slot::build(kGatherSharesSlotPrefix, tag);
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    post(receives, p, false, share(p), bytes(p), gather_slot);
    post(sends, p, true, share(me), mine, gather_slot);
  }
  wait_all(receives, deadline, "reduced share");
  wait_all(sends, deadline, "reduced share");
}

void GlooCommunicator::run_all_reduce(const Tensor& tensor, ReduceOp op, uint32_t tag, Clock::time_point deadline) {
  const auto count = static_cast<size_t>(tensor.numel());
  std::vector<size_t> bounds(size_t(size()) + 1);
  for (int r = 0; r <= size(); ++r) bounds[size_t(r)] = count * size_t(r) / size_t(size());  // near-equal shares
  reduce_shares(static_cast<uint8_t*>(tensor.raw_data()), tensor.dtype(), bounds, op, tag, deadline, /*gather=*/true);
}

void GlooCommunicator::run_reduce_scatter(const Op& op, uint32_t tag, Clock::time_point deadline) {
  const Tensor& out = op.tensor;
  const size_t nbytes = out.nbytes(), count = static_cast<size_t>(out.numel());
  if (nbytes == 0) return;
  std::vector<uint8_t> all(nbytes * size_t(size()));
  for (int r = 0; r < size(); ++r) std::memcpy(all.data() + size_t(r) * nbytes, op.list[size_t(r)].raw_data(), nbytes);
  std::vector<size_t> bounds(size_t(size()) + 1);
  for (int r = 0; r <= size(); ++r) bounds[size_t(r)] = count * size_t(r);  // share r: rank r's result
  reduce_shares(all.data(), out.dtype(), bounds, op.reduce, tag, deadline, /*gather=*/false);
  std::memcpy(out.raw_data(), all.data() + size_t(rank()) * nbytes, nbytes);
}

}  // namespace loom::distributed
