// new_group and DeviceMesh (parallel/comm/new_group.h, parallel/device_mesh.h): groups over
// subsets of the world, their ranks, the row-major mesh layout, and the errors of a rank
// that disagrees or is not a member. Ranks are threads, each with its own World.
#include <doctest/doctest.h>

#include "core/factory.h"              // defines: full
#include "parallel/device_mesh.h"      // defines: DeviceMesh
#include "rank_threads.h"              // defines: run_rank_threads, require_no_errors, contains

using namespace loom;
using namespace loom::distributed;
using loom::testing::contains;
using loom::testing::require_no_errors;
using loom::testing::run_rank_threads;

namespace {

World thread_world(int rank, int size, std::shared_ptr<TCPStore> store,
                   std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  return World{.store = std::move(store), .rank = rank, .size = size, .timeout = timeout, .prefix = "test"};
}

// The sum over `group` of each member's `value`.
double group_sum(Communicator& group, double value) {
  Tensor t = full({1}, value, TensorOptions(kFloat64));
  group.all_reduce(t)->wait();
  return t.item<double>();
}

}  // namespace

TEST_CASE("new_group: members get group ranks, non-members a handle whose operations are errors") {
  auto errors = run_rank_threads(4, [](int r, std::shared_ptr<TCPStore> store) {
    World world = thread_world(r, 4, store);
    auto evens = new_group(world, {2, 0}, "evens");  // any order: sorted, as PyTorch
    auto odds = new_group(world, {1, 3}, "odds");
    auto& mine = r % 2 == 0 ? evens : odds;
    auto& other = r % 2 == 0 ? odds : evens;
    CHECK(mine->is_member());
    CHECK(mine->rank() == r / 2);
    CHECK(mine->size() == 2);
    CHECK(mine->group_name() == (r % 2 == 0 ? "evens" : "odds"));
    CHECK(group_sum(*mine, r) == (r % 2 == 0 ? 0 + 2 : 1 + 3));
    CHECK_FALSE(other->is_member());
    CHECK(other->rank() == -1);
    Tensor t = zeros({1});
    try {
      other->all_reduce(t);
      FAIL("a non-member's all_reduce must throw");
    } catch (const Error& e) {
      CHECK(contains(e.what(), "all_reduce on process group '"));
      CHECK(contains(e.what(), "not a member"));
    }
    // A group of one, and one of everybody, made after the others.
    auto alone = new_group(world, {3});
    CHECK(alone->is_member() == (r == 3));
    if (r == 3) CHECK(group_sum(*alone, 5) == 5);
    auto all = new_group(world, {0, 1, 2, 3});
    CHECK(all->rank() == r);
    CHECK(group_sum(*all, r) == 6);
  });
  require_no_errors(errors);
}

TEST_CASE("new_group: point-to-point inside a group uses group ranks") {
  auto errors = run_rank_threads(3, [](int r, std::shared_ptr<TCPStore> store) {
    World world = thread_world(r, 3, store);
    auto tail = new_group(world, {1, 2});
    if (r == 0) return;
    Tensor t = full({3}, static_cast<double>(r), TensorOptions(kFloat32));
    if (tail->rank() == 0) {
      tail->send(t, 1)->wait();
    } else {
      tail->recv(t, 0)->wait();
      CHECK(t.tolist<float>() == std::vector<float>{1, 1, 1});
    }
  });
  require_no_errors(errors);
}

TEST_CASE("new_group: a rank that passes another list is a clear error, not a hang") {
  // Ranks 0 and 1 make {0, 1}; rank 2 believes the first group is {1, 2}.
  auto errors = run_rank_threads(3, [](int r, std::shared_ptr<TCPStore> store) {
    World world = thread_world(r, 3, store, std::chrono::seconds(5));
    new_group(world, r == 2 ? std::vector<int>{1, 2} : std::vector<int>{0, 1});
  });
  CHECK(errors[0].empty());
  CHECK(errors[1].empty());
  CHECK(contains(errors[2], "new_group #0: world rank 2 passed ranks [1, 2] but world rank 1 passed [0, 1]"));
}

TEST_CASE("new_group: a member that never makes the group is a timeout naming it") {
  auto errors = run_rank_threads(2, [](int r, std::shared_ptr<TCPStore> store) {
    World world = thread_world(r, 2, store, std::chrono::milliseconds(500));
    if (r == 0) new_group(world, {0, 1}, "pair");
  });
  CHECK(contains(errors[0], "new_group #0 ('pair'): world rank 0 waited 500 ms"));
  CHECK(contains(errors[0], "world rank(s) [1] never made this group"));
  CHECK(errors[1].empty());
}

TEST_CASE("new_group: bad rank lists") {
  auto server = std::make_shared<TCPStore>("127.0.0.1", 0, /*is_server=*/true, std::chrono::seconds(5));
  World world = thread_world(0, 2, server);
  CHECK_THROWS_WITH_AS(new_group(world, {}), doctest::Contains("expected at least one rank"), Error);
  CHECK_THROWS_WITH_AS(new_group(world, {0, 2}), doctest::Contains("must be world ranks in [0, 2)"), Error);
  CHECK_THROWS_WITH_AS(new_group(world, {1, 1}), doctest::Contains("lists rank 1 twice"), Error);
  CHECK(world.groups_made == 3);  // numbered even when refused: every rank refuses the same call
}

TEST_CASE("DeviceMesh 2 x 2: row-major layout, a group along each dimension") {
  auto errors = run_rank_threads(4, [](int r, std::shared_ptr<TCPStore> store) {
    World world = thread_world(r, 4, store);
    DeviceMesh mesh("cpu", {2, 2}, {"pp", "dp"}, world);
    CHECK(mesh.str() == "DeviceMesh('cpu', [[0, 1], [2, 3]], mesh_dim_names=('pp', 'dp'))");
    CHECK(mesh.coordinate() == std::vector<int>{r / 2, r % 2});
    CHECK(mesh.local_rank("pp") == r / 2);
    CHECK(mesh.local_rank("dp") == r % 2);
    CHECK(mesh.size("dp") == 2);
    CHECK(mesh.size() == 4);
    CHECK(mesh.group("dp")->rank() == r % 2);
    CHECK(mesh.group("pp")->rank() == r / 2);
    CHECK(mesh.group_ranks("dp") == std::vector<int>{r / 2 * 2, r / 2 * 2 + 1});
    CHECK(mesh.group_ranks("pp") == std::vector<int>{r % 2, r % 2 + 2});
    // Sums over the rows ("dp": {0,1}, {2,3}) and the columns ("pp": {0,2}, {1,3}).
    CHECK(group_sum(*mesh.group("dp"), r) == (r < 2 ? 1 : 5));
    CHECK(group_sum(*mesh.get_group("pp"), r) == (r % 2 == 0 ? 2 : 4));
    CHECK_THROWS_WITH_AS(mesh.group("tp"), doctest::Contains("no dimension named 'tp'; this mesh's dimensions are "
                                                             "'pp', 'dp'"), Error);
  });
  require_no_errors(errors);
}

TEST_CASE("DeviceMesh 3 x 2 and 1 x 2: unequal dimensions and a dimension of one") {
  auto errors = run_rank_threads(6, [](int r, std::shared_ptr<TCPStore> store) {
    World world = thread_world(r, 6, store);
    DeviceMesh mesh("cpu", {3, 2}, {"pp", "dp"}, world);
    CHECK(mesh.group_ranks("pp") == std::vector<int>{r % 2, r % 2 + 2, r % 2 + 4});
    CHECK(group_sum(*mesh.group("pp"), 1) == 3);
    CHECK(group_sum(*mesh.group("dp"), r) == (r / 2 * 2) * 2 + 1);
  });
  require_no_errors(errors);
  errors = run_rank_threads(2, [](int r, std::shared_ptr<TCPStore> store) {
    World world = thread_world(r, 2, store);
    DeviceMesh mesh("cpu", {1, 2}, {"pp", "dp"}, world);
    CHECK(mesh.size("pp") == 1);
    CHECK(mesh.group("pp")->size() == 1);
    CHECK(group_sum(*mesh.group("pp"), 7) == 7);
    CHECK(group_sum(*mesh.group("dp"), 1) == 2);
  });
  require_no_errors(errors);
}

TEST_CASE("DeviceMesh: a shape that does not hold the world, and bad names, are clear errors") {
  auto server = std::make_shared<TCPStore>("127.0.0.1", 0, /*is_server=*/true, std::chrono::seconds(5));
  World world = thread_world(0, 4, server);
  CHECK_THROWS_WITH_AS(DeviceMesh("cpu", {2, 3}, {"pp", "dp"}, world),
                       doctest::Contains("the mesh shape [2, 3] holds 6 ranks but the world has 4"), Error);
  CHECK_THROWS_WITH_AS(DeviceMesh("cpu", {2, 2}, {"pp"}, world), doctest::Contains("1 dimension names for a mesh "
                                                                                   "of 2 dimensions"), Error);
  CHECK_THROWS_WITH_AS(DeviceMesh("cpu", {2, 2}, {"dp", "dp"}, world), doctest::Contains("'dp' is used twice"), Error);
  CHECK_THROWS_WITH_AS(DeviceMesh("tpu", {4}, {}, world), doctest::Contains("expected device_type \"cpu\" or "
                                                                            "\"cuda\""), Error);
  CHECK_THROWS_WITH_AS(DeviceMesh("cpu", {0, 4}, {}, world), doctest::Contains("must be at least 1"), Error);
  CHECK(world.groups_made == 0);  // refused before any group was made
}
