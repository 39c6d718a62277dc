// new_group: a communicator over some of the world's ranks, as torch.distributed.new_group.
//
//   init_process_group("gloo");                         // world: ranks 0..3
//   auto evens = new_group({0, 2}, "evens");            // EVERY rank calls it, in the same order
//   auto odds = new_group({1, 3}, "odds");
//   auto& mine = get_rank() % 2 == 0 ? evens : odds;
//   mine->all_reduce(t);                                // rank() and size() are the group's: 0..1
//
// Every rank calls new_group for every group, members or not, in the same order: the
// groups are numbered by that order, and the number names their keys in the store (Note
// [Groups are numbered by call order]). A rank outside `ranks` gets a handle that is not
// a member (rank() == -1, is_member() false); its operations are errors naming the group.
// Inside the group, ranks are the group's: rank r of the group is ranks[r] of the world
// (ranks is sorted first, as PyTorch does), and collectives take and report those.
//
// Each group is a communicator of the world's backend over the world's store: Gloo gets
// a context of its own (its own TCP pairs, and its own shared-memory segment when the
// ranks share a host); NCCL a communicator of its own from a unique id exchanged under
// the group's keys. Groups never share a connection, so collectives of different groups
// may run at once (a pipeline's sends while its data-parallel all-reduce runs).
//
// Note [Groups are numbered by call order]
// PyTorch requires every rank to call new_group for every group, in the same order, and
// so does loom: that is how the ranks of a group find each other's keys without anyone
// choosing a name for them. The n-th call on every rank makes group n, with keys under
// <world prefix>/group/<n>/. What can go wrong is checked before any connection is made:
// each member publishes the ranks list it passed and reads every other member's, so a
// rank that passed a different list is a clear error naming both lists, not a Gloo
// context that waits for a peer who is building another group. A member that never
// calls new_group at all is a timeout naming the ranks that did not arrive.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "parallel/comm/communicator.h"  // defines: Communicator
#include "parallel/store/tcp_store.h"    // defines: TCPStore

namespace loom::distributed {

// What new_group needs to know about the world it divides. init_process_group keeps one
// for the default group; tests that run ranks as threads of one process make one per
// thread.
struct World {
  std::shared_ptr<TCPStore> store;
  std::string backend = "gloo";  // "gloo" | "nccl": every group uses the world's
  int rank = 0;                  // this process's rank in the world
  int size = 1;
  std::chrono::milliseconds timeout = kDefaultCommTimeout;
  std::string master_addr = "127.0.0.1";  // where the store is; how Gloo picks its address
  std::string prefix = "world";           // groups' keys go under <prefix>/group/<n>
  int groups_made = 0;  // the number of the next group; the same on every rank (see the Note)
};

// The world's n-th group over `ranks` (distinct world ranks, any order); `name` is only
// for messages ("" names it group<n>). A collective over the whole world: every rank
// calls it, in the same order. See Note [Groups are numbered by call order].
std::shared_ptr<Communicator> new_group(World& world, std::vector<int> ranks, const std::string& name = "");

// The same on the default process group's world (after init_process_group).
std::shared_ptr<Communicator> new_group(const std::vector<int>& ranks, const std::string& name = "");

// "[0, 2, 3]": rank lists (and mesh shapes) as the messages print them.
std::string format_ranks(const std::vector<int>& ranks);

}  // namespace loom::distributed
