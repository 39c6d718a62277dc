// Who is still there? After an operation of a TCP group fails, each rank that saw the
// failure answers a roll call through the store, and its error names the ranks, and the
// hosts, that did not answer.
//
//   announce_host(*store, prefix, rank, "10.0.0.2");        // at construction, every rank
//   ...
//   std::string words = roll_call(store->host(), store->port(), prefix, rank, size,
//                                 "all_reduce #12", std::chrono::seconds(3));
//   // "ranks 2, 3 (on node02, 10.0.0.2) did not answer ..."
//
// Note [A roll call after a failure]
// Gloo's errors say what broke on this rank's side: "Connection closed by peer
// [10.0.0.2]:41234", or "Timed out waiting 30000ms for recv operation to complete", which
// names no peer at all. Across machines the question is which host went, so each rank
// whose operation failed checks in under "<group>/roll_call/<rank>" and waits a few
// seconds for the others to do the same (they fail at about the same time: a closed
// connection is seen at once, and a timeout runs from a collective every rank entered
// together). The ranks that never check in are the lost ones: exited, hung outside the
// group's operations, or on a host this one cannot reach. A live rank may be waiting on
// the failed one (for its part of a broadcast, say) rather than failing itself; so the
// failed rank first closes its Gloo connections, which fails such waits at once. The
// roll call runs on a store connection of its own with a short deadline, because the
// group's connection may be blocked, and the store itself may be gone (it lives in rank
// 0's process) or behind the same cut link; then that is the finding. Nothing is spent
// while the group is healthy.
#pragma once

#include <chrono>
#include <string>

#include "parallel/store/tcp_store.h"

namespace loom::distributed {

// Records where this rank runs (its host name and the address its peers connect to),
// for a later roll call's message.
void announce_host(TCPStore& store, const std::string& prefix, int rank, const std::string& address);

// See Note [A roll call after a failure]. `what` names the operation that failed here.
// Returns one sentence for the error message; never throws.
std::string roll_call(const std::string& store_host, int store_port, const std::string& prefix, int rank, int size,
                      const std::string& what, std::chrono::milliseconds wait);

}  // namespace loom::distributed
