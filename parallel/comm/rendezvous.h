// The check every rank makes at init_process_group, before any communicator exists:
// do all processes agree on who they are?
//
//   TCPStore store(master_addr, master_port, rank == 0, timeout);
//   verify_rendezvous(store, "default_pg/0", rank, world_size, "gloo", timeout);
//   // now every rank 0..world_size-1 has arrived exactly once, all with this
//   // world_size and backend -- or this threw, saying who disagrees
//
// Note [Why check the rendezvous]
// A launch mistake -- two workers given the same RANK, one started with another
// WORLD_SIZE, a node with --backend nccl next to one with gloo -- otherwise surfaces
// much later and much worse: Gloo or NCCL wait for a peer that will never connect and
// time out minutes later with a message about a socket, or the job runs with one rank
// silently ignored. The store is already up at this point, so a few keys settle it:
//   <prefix>/rendezvous/claim/<rank>   counter: a second process with this RANK sees 2
//   <prefix>/rendezvous/world/<rank>   "WORLD_SIZE=<n> backend=<b>" as this rank sees it
// Rank 0 waits for every other rank's entry (a rank that never arrives is a timeout
// naming the missing ranks) and compares each with its own; every other rank compares
// its own with rank 0's. A rank whose WORLD_SIZE is larger than rank 0's may have a
// RANK rank 0 never waits for; it still reads rank 0's entry and fails, and the
// launcher then stops the job.
#pragma once

#include <chrono>
#include <string>

#include "parallel/store/tcp_store.h"

namespace loom::distributed {

// Throws a loom::Error naming the disagreement (duplicate RANK, different WORLD_SIZE or
// backend, ranks that did not arrive within `timeout`). See Note [Why check the rendezvous].
void verify_rendezvous(TCPStore& store, const std::string& prefix, int rank, int world_size,
                       const std::string& backend, std::chrono::milliseconds timeout);

}  // namespace loom::distributed
