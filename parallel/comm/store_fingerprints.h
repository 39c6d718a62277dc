// StoreFingerprints: the checks of Note [Why a fingerprint before every collective]
// (op.h), carried by the rendezvous store instead of the backend's own transport.
//
//   StoreFingerprints fingerprints(store, "group0", rank, size);
//   auto gathered = fingerprints.gather(op, deadline);   // every rank's fingerprint of op
//   if (!gathered.missing.empty()) ...                   // they never arrived: a timeout
//   check_same_collective(gathered.all, op);             // a clean error when ranks differ
//
// Note [Fingerprints through the store]
// Gloo all-gathers fingerprints with its own collective, on its worker thread. A GPU
// backend cannot do that cheaply: a fingerprint exchanged on the GPU would make the
// host wait for every earlier operation on the communication stream before it could
// read the answer, serialising the host with the GPU before every collective. The
// store is a host-side path that does not wait for the GPU: each rank sets its
// fingerprint under <prefix>/fp/<seq>/<rank> and reads the others', which costs
// 3 + (size - 1) small store round trips per collective and waits only for the other
// ranks' *hosts* to reach the same call. Keys are deleted one collective later: when a
// rank has read every fingerprint of collective n, every rank has finished reading
// those of n - 1 (it read them before publishing n), so its own key of n - 1 is dead.
//
// Point-to-point: the sender sets the header of its m-th message to a peer under
// <prefix>/p2p/<src>-<dst>/<m>; the receiver takes (reads and deletes) the header of
// its m-th message from that peer before posting its receive, and so learns the
// sender's dtype, shape and tag. Messages between two ranks are numbered in call
// order, which is how NCCL matches them.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "parallel/comm/op.h"  // defines: Op, Fingerprint
#include "parallel/store/tcp_store.h"

namespace loom::distributed {

class StoreFingerprints {
 public:
  using Deadline = std::chrono::steady_clock::time_point;

  StoreFingerprints(std::shared_ptr<TCPStore> store, std::string prefix, int rank, int size);

  struct Gathered {
    std::vector<Fingerprint> all;  // index = rank; complete only when `missing` is empty
    std::vector<int> missing;      // ranks whose fingerprint had not arrived by the deadline
  };
  // Collective `op` (numbered op.seq): publishes this rank's fingerprint and reads every
  // rank's. Store failures other than the deadline throw.
  Gathered gather(const Op& op, Deadline deadline);

  // Send `op` to op.peer: publishes its header (fingerprint, id = op.tag). Never waits.
  void post_header(const Op& op);
  // Recv `op` from op.peer: takes the header of the next message from that peer;
  // nullopt when the sender has not posted it by the deadline.
  std::optional<Fingerprint> take_header(const Op& op, Deadline deadline);

 private:
  std::string collective_key(uint64_t seq, int rank) const;
  std::string message_key(int src, int dst, uint64_t number) const;

  std::shared_ptr<TCPStore> store_;
  std::string prefix_;
  int rank_;
  std::optional<uint64_t> last_gathered_;  // its key is deleted after the next gather
  std::vector<uint64_t> sent_;             // messages sent to each peer so far
  std::vector<uint64_t> received_;         // messages taken from each peer so far
};

}  // namespace loom::distributed
