#include "parallel/comm/new_group.h"

#include <algorithm>
#include <sstream>

#include "core/error.h"                     // defines: LOOM_CHECK, LOOM_FAIL
#include "parallel/comm/process_group.h"    // defines: make_communicator

namespace loom::distributed {

namespace {

// What a rank outside the group holds: the group's size and name, and no connection.
// Every operation fails before it gets here (Communicator::check_member).
class NonMemberCommunicator final : public Communicator {
 public:
  NonMemberCommunicator(std::string backend, int size, std::chrono::milliseconds timeout)
      : Communicator(/*rank=*/-1, size, timeout), backend_(std::move(backend)) {}
  const char* backend() const override { return backend_.c_str(); }

 protected:
  std::shared_ptr<Work> launch(Op) override { LOOM_FAIL("unreachable: a non-member's operation was launched"); }

 private:
  std::string backend_;
};

// Each member publishes the list it passed and reads every other member's: see Note
// [Groups are numbered by call order].
void check_members_agree(World& world, const std::string& prefix, const std::string& label,
                         const std::vector<int>& ranks) {
  const std::string mine = format_ranks(ranks);
  world.store->set(prefix + "/ranks/" + std::to_string(world.rank), mine);
  std::vector<std::string> keys;
  for (int r : ranks)
    if (r != world.rank) keys.push_back(prefix + "/ranks/" + std::to_string(r));
  try {
    world.store->wait(keys, world.timeout);
  } catch (const Error&) {
    std::vector<int> missing;
    for (int r : ranks)
      if (r != world.rank && !world.store->check({prefix + "/ranks/" + std::to_string(r)})) missing.push_back(r);
    LOOM_FAIL(label, ": world rank ", world.rank, " waited ", world.timeout.count(), " ms for the group's other "
              "members, but world rank(s) ", format_ranks(missing), " never made this group. Every rank must call "
              "new_group for every group, in the same order (Note [Groups are numbered by call order])");
  }
  for (int r : ranks) {
    if (r == world.rank) continue;
    const std::string theirs = world.store->get(prefix + "/ranks/" + std::to_string(r));
    LOOM_CHECK(theirs == mine, label, ": world rank ", world.rank, " passed ranks ", mine, " but world rank ", r,
               " passed ", theirs, " to the same call. Every rank must pass the same list to the n-th new_group "
               "(Note [Groups are numbered by call order])");
  }
}

}  // namespace

std::string format_ranks(const std::vector<int>& ranks) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < ranks.size(); ++i) out << (i ? ", " : "") << ranks[i];
  out << "]";
  return out.str();
}

std::shared_ptr<Communicator> new_group(World& world, std::vector<int> ranks, const std::string& name) {
  LOOM_CHECK(world.store != nullptr, "new_group: the world has no store; call init_process_group() first");
  const int number = world.groups_made++;  // before any check can throw: see the Note
  const std::string label = "new_group #" + std::to_string(number) + (name.empty() ? "" : " ('" + name + "')");
  LOOM_CHECK(!ranks.empty(), label, ": expected at least one rank, got an empty list");
  std::sort(ranks.begin(), ranks.end());
  for (size_t i = 0; i < ranks.size(); ++i) {
    LOOM_CHECK(ranks[i] >= 0 && ranks[i] < world.size, label, ": ranks ", format_ranks(ranks),
               " must be world ranks in [0, ", world.size, ")");
    LOOM_CHECK(i == 0 || ranks[i] != ranks[i - 1], label, ": ranks ", format_ranks(ranks), " lists rank ", ranks[i],
               " twice");
  }
  const std::string group_name = name.empty() ? "group" + std::to_string(number) : name;
  const auto it = std::find(ranks.begin(), ranks.end(), world.rank);
  std::shared_ptr<Communicator> comm;
  if (it == ranks.end()) {
    comm = std::make_shared<NonMemberCommunicator>(world.backend, static_cast<int>(ranks.size()), world.timeout);
  } else {
    const std::string prefix = world.prefix + "/group/" + std::to_string(number);
    check_members_agree(world, prefix, label, ranks);
    comm = make_communicator(world.backend, world.store, prefix, static_cast<int>(it - ranks.begin()),
                             static_cast<int>(ranks.size()), world.timeout, world.master_addr, world.rank);
  }
  comm->set_group_name(group_name);
  return comm;
}

}  // namespace loom::distributed
