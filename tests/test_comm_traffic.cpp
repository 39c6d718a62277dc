// The bytes every collective moves (parallel/comm/traffic.h): each kind against
// nccl-tests' formula on 2 and 3 ranks, per communicator and per process, over shared
// memory and TCP. Ranks are threads (tests/rank_threads.h), each with its own gloo
// communicator. The parallel modes' traffic is tests/test_traffic_modes.cpp.
//
// Counts do not depend on the machine, so every check is exact, or within the half
// byte per call that all_reduce's rounding allows (2(N-1)/N * S is a fraction for odd N).
#include <doctest/doctest.h>

#include <cmath>
#include <mutex>

#include "core/factory.h"              // defines: full, zeros, empty
#include "parallel/comm/new_group.h"  // defines: World, new_group
#include "parallel/comm/traffic.h"    // defines: Traffic, bus_bytes, process_traffic, traffic_json
#include "rank_threads.h"             // defines: run_ranks, run_rank_threads

using namespace loom;
using namespace loom::testing;
using distributed::Communicator;
using distributed::OpKind;
using distributed::Traffic;

namespace {

// 2(N-1)/N * S and (N-1)/N * S as real numbers, for comparing with whole-byte counts.
double all_reduce_formula(double s, int n) { return 2.0 * (n - 1) / n * s; }
double gather_formula(double s, int n) { return double(n - 1) / n * s; }

}  // namespace

TEST_CASE("bus_bytes: nccl-tests' factors; products before the division, so odd worlds are not 0") {
  using distributed::bus_bytes;
  CHECK(bus_bytes(OpKind::AllReduce, 400, 2) == 400);
  CHECK(bus_bytes(OpKind::AllReduce, 400, 4) == 600);
  CHECK(bus_bytes(OpKind::AllReduce, 400, 3) == 533);  // 533.33
  CHECK(bus_bytes(OpKind::AllReduce, 28, 3) == 37);    // 37.33
  CHECK(bus_bytes(OpKind::AllReduce, 20, 3) == 27);    // 26.67: to the nearest
  CHECK(bus_bytes(OpKind::AllGather, 84, 3) == 56);    // 3 shards of 28: two come in
  CHECK(bus_bytes(OpKind::ReduceScatter, 84, 3) == 56);
  CHECK(bus_bytes(OpKind::Broadcast, 28, 3) == 28);
  CHECK(bus_bytes(OpKind::Send, 28, 3) == 28);
  CHECK(bus_bytes(OpKind::Recv, 28, 3) == 28);
  CHECK(bus_bytes(OpKind::Barrier, 0, 3) == 0);
  // A group of one moves nothing.
  for (OpKind kind : distributed::kTrafficKinds)
    if (kind != OpKind::Send && kind != OpKind::Recv) CHECK(bus_bytes(kind, 400, 1) == 0);
  CHECK_THROWS_WITH_AS(bus_bytes(OpKind::AllReduce, 4, 0), doctest::Contains("group size >= 1"), Error);
}

TEST_CASE("Traffic: differences, sums, str and the per-step JSON a trainer writes") {
  Traffic a;
  a.all_reduce = {2, 800, 800};
  a.broadcast = {1, 40, 40};
  a.barrier = {3, 0, 0};
  Traffic b = a;
  b.all_reduce = {5, 2000, 2000};
  CHECK((b - a).all_reduce == distributed::KindTraffic{3, 1200, 1200});
  CHECK((b - a).broadcast.calls == 0);
  Traffic c = a;
  c += a;
  CHECK(c.all_reduce.bytes == 1600);
  CHECK(c.total_bytes() == 1680);
  CHECK(c.total_calls() == 12);
  CHECK(a[OpKind::Broadcast].bytes == 40);
  CHECK(a.str() == "all_reduce: 2 calls, 800 B; broadcast: 1 call, 40 B; barrier: 3 calls");
  CHECK(Traffic{}.str() == "no communication");
  CHECK(distributed::traffic_json(b, 2) ==
        R"({"all_reduce": 1000, "all_gather": 0, "reduce_scatter": 0, "broadcast": 20, "send": 0, "recv": 0})");
  CHECK_THROWS_WITH_AS(distributed::traffic_json(b, 0), doctest::Contains("steps >= 1"), Error);
}

// One of each kind on every rank, with a payload whose all_reduce bytes are a fraction
// for N = 3: every count against its formula, on shared memory and on TCP.
TEST_CASE("every kind of collective counts its calls and bytes per rank; the process sums its communicators") {
  for (int world : {2, 3}) {
    for (bool shm : {true, false}) {
      CAPTURE(world);
      CAPTURE(shm);
      constexpr int64_t kNumel = 7;
      constexpr double kBytes = 4 * kNumel;  // S of one float32 tensor of 7
      std::vector<Traffic> seen(world);
      distributed::reset_process_traffic();
      require_no_errors(run_ranks(
          world,
          [&](std::shared_ptr<Communicator> comm) {
            const int rank = comm->rank(), n = comm->size();
            CHECK(comm->traffic() == Traffic{});
            Tensor t = full({kNumel}, float(rank + 1));
            comm->all_reduce(t)->wait();
            comm->all_reduce(t)->wait();
            std::vector<Tensor> gathered;
            comm->all_gather(gathered, t)->wait();
            std::vector<Tensor> pieces;
            for (int r = 0; r < n; ++r) pieces.push_back(full({kNumel}, 1.0f));
            comm->reduce_scatter(t, pieces)->wait();
            comm->broadcast(t, 0)->wait();
            // A ring: each rank sends one tensor to the next and receives one from the one before.
            auto sent = comm->send(t, (rank + 1) % n);
            Tensor in = empty({kNumel}, kFloat32);
            comm->recv(in, (rank + n - 1) % n)->wait();
            sent->wait();
            comm->barrier()->wait();

            const Traffic mine = comm->traffic();
            seen[rank] = mine;
            CHECK(mine.all_reduce.calls == 2);
            CHECK(mine.all_reduce.payload_bytes == 2 * kBytes);
            CHECK(std::abs(mine.all_reduce.bytes - 2 * all_reduce_formula(kBytes, n)) <= 2 * 0.5);
            CHECK(mine.all_gather == distributed::KindTraffic{1, int64_t(gather_formula(n * kBytes, n)), n * int64_t(kBytes)});
            CHECK(mine.reduce_scatter == distributed::KindTraffic{1, int64_t(gather_formula(n * kBytes, n)), n * int64_t(kBytes)});
            CHECK(mine.broadcast == distributed::KindTraffic{1, int64_t(kBytes), int64_t(kBytes)});
            CHECK(mine.send == distributed::KindTraffic{1, int64_t(kBytes), int64_t(kBytes)});
            CHECK(mine.recv == distributed::KindTraffic{1, int64_t(kBytes), int64_t(kBytes)});
            CHECK(mine.barrier == distributed::KindTraffic{1, 0, 0});
            comm->reset_traffic();
            CHECK(comm->traffic() == Traffic{});
          },
          20s, shm));
      // The process-wide total saw every rank's communicator; reset_traffic on each did not touch it.
      Traffic sum;
      for (const Traffic& t : seen) sum += t;
      CHECK(distributed::process_traffic() == sum);
      distributed::reset_process_traffic();
      CHECK(distributed::process_traffic() == Traffic{});
    }
  }
}

TEST_CASE("a subgroup's traffic is its own and the process's; a one-sided all_gather counts as an all_gather") {
  distributed::reset_process_traffic();
  std::mutex mutex;
  Traffic groups_total;
  require_no_errors(run_rank_threads(3, [&](int rank, std::shared_ptr<distributed::TCPStore> store) {
    omp_set_num_threads(1);
    distributed::World world{.store = store, .rank = rank, .size = 3, .timeout = 20s};
    auto all = distributed::new_group(world, {0, 1, 2}, "all");
    auto pair = distributed::new_group(world, {0, 1}, "pair");
    Tensor t = zeros({10}, kFloat32);
    all->all_reduce(t)->wait();
    if (pair->is_member()) pair->all_reduce(t)->wait();
    CHECK(all->traffic().all_reduce.bytes == 53);  // 2 * 2/3 * 40 = 53.33
    CHECK(pair->traffic().all_reduce.bytes == (pair->is_member() ? 40 : 0));

    // One-sided: each rank reads its peers' pieces of symmetric memory (shared memory here).
    Tensor piece = all->zeros_symmetric({10}, TensorOptions(kFloat32));
    REQUIRE(all->is_symmetric(piece));
    all->barrier()->wait();
    std::vector<Tensor> out;
    all->all_gather_one_sided(out, piece);
    all->barrier()->wait();
    CHECK(all->traffic().all_gather == distributed::KindTraffic{1, 80, 120});
    std::lock_guard<std::mutex> lock(mutex);
    groups_total += all->traffic();
    groups_total += pair->traffic();
  }));
  // new_group's own setup talks through the store, not through collectives: the process
  // saw exactly what the groups counted.
  CHECK(distributed::process_traffic() == groups_total);
}
