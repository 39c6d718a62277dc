// The gloo backend's errors, over TCP as in test_comm_gloo.cpp: operations that disagree
// across ranks, a rank that never arrives, a communicator destroyed with queued work,
// arguments checked before anything moves, the default process group's teaching errors,
// and SIGPIPE's disposition (so that a peer that closed first is an error, not a death). Each fails with a message naming the rank,
// the operation and what was expected; none hangs or aborts.
#include <doctest/doctest.h>

#include <signal.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "core/factory.h"
#include "cuda/device.h"  // defines: is_available
#include "never_arrives.h"  // defines: NeverArrives

using namespace loom;
using namespace loom::distributed;
using namespace std::chrono_literals;

#ifdef LOOM_WITH_GLOO
#include "parallel/comm/gloo_communicator.h"
#include "parallel/comm/process_group.h"
#include "parallel/store/socket.h"

#include "gloo_tcp_ranks.h"  // defines: run_tcp_ranks
#include "rank_threads.h"    // defines: require_no_errors, contains

using loom::testing::contains;
using loom::testing::require_no_errors;
using loom::testing::run_tcp_ranks;

TEST_CASE("mismatched shapes or ops across ranks are an error on every rank, not a hang or an abort") {
  std::vector<std::string> messages(2);
  std::vector<float> after(2);
  auto errors = run_tcp_ranks(2, [&](Communicator& comm) {
    const int r = comm.rank();
    try {
      comm.all_reduce(zeros({r == 0 ? 4 : 5}))->wait();
    } catch (const Error& e) {
      messages[r] = e.what();
    }
    try {
      if (r == 0) comm.barrier()->wait();
      else comm.broadcast(zeros({2}), 0)->wait();
    } catch (const Error& e) {
      messages[r] += e.what();
    }
    Tensor t = ones({2});
    comm.all_reduce(t)->wait();  // the communicator is still usable
    after[r] = t.tolist<float>()[0];
  }, 5s);
  require_no_errors(errors);
  for (int r = 0; r < 2; ++r) {
    CAPTURE(messages[r]);
    CHECK(contains(messages[r], "all_reduce #0 (sum) of float32 [" + std::to_string(r == 0 ? 4 : 5) + "]"));
    CHECK(contains(messages[r], "all_reduce(sum) of float32 [4] on rank 0"));
    CHECK(contains(messages[r], "all_reduce(sum) of float32 [5] on rank 1"));
    CHECK(contains(messages[r], "barrier on rank 0"));
    CHECK(contains(messages[r], "broadcast(root 0) of float32 [2] on rank 1"));
    CHECK(after[r] == 2);
  }
}

TEST_CASE("a recv whose tensor does not match the sender's fails with both shapes; the group goes on") {
  std::string message;
  std::vector<float> later;
  require_no_errors(run_tcp_ranks(2, [&](Communicator& comm) {
    if (comm.rank() == 0) {
      comm.send(ones({4}), 1)->wait();
      comm.send(full({2}, 5), 1)->wait();
    } else {
      try {
        comm.recv(zeros({5}), 0)->wait();
      } catch (const Error& e) {
        message = e.what();
      }
      Tensor t = zeros({2});
      comm.recv(t, 0)->wait();
      later = t.tolist<float>();
    }
  }, 5s));
  CHECK(contains(message, "recv #0 (from rank 0, tag 0) of float32 [5] on rank 1 of 2"));
  CHECK(contains(message, "rank 0 sent float32 [4]"));
  CHECK(later == std::vector<float>{5, 5});
}

TEST_CASE("a rank that never arrives: timeout naming rank, op, number and shape; then the group is unusable") {
  loom::testing::NeverArrives seen;
  require_no_errors(run_tcp_ranks(2, [&](Communicator& comm) { seen.run(comm, 1500ms, {}); }, 700ms));
  // Gloo's timeout names no peer; the roll call does (Note [A roll call after a failure]).
  seen.check(700ms, /*why=*/"Rank 1 (on ", /*at_most_seconds=*/3.0);
  CHECK(contains(seen.first, "did not answer a roll call through the store within 0.175 s"));
  CHECK(contains(seen.first, "(ranks 0 (on "));
}

TEST_CASE("a rank that left: the others fail at once, and their errors name it after a roll call") {
  std::vector<std::string> messages(3);
  std::vector<double> seconds(3);
  require_no_errors(run_tcp_ranks(3, [&](Communicator& comm) {
    const int r = comm.rank();
    if (r == 2) return;  // its communicator closes its connections
    const auto start = std::chrono::steady_clock::now();
    try {
      comm.all_reduce(ones({1000}))->wait();
    } catch (const Error& e) {
      messages[size_t(r)] = e.what();
    }
    seconds[size_t(r)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }, 4s));
  for (int r = 0; r < 2; ++r) {
    CAPTURE(messages[size_t(r)]);
    CHECK(contains(messages[size_t(r)], "all_reduce #0 (sum) of float32 [1000] on rank " + std::to_string(r)));
    CHECK(contains(messages[size_t(r)], "Rank 2 (on "));
    CHECK(contains(messages[size_t(r)], "did not answer a roll call through the store within 1 s"));
    CHECK(contains(messages[size_t(r)], "(ranks 0, 1 (on "));
    CHECK(seconds[size_t(r)] < 3.5);  // the roll call's second, not the 4 s timeout
  }
}

TEST_CASE("a failed rank closes its connections: a peer waiting on it fails at once and answers the roll call") {
  // Rank 2 leaves; rank 0's all_reduce fails; rank 1 waits for a message from rank 0
  // alone, which never comes. Without the closing it would wait for its 4 s timeout, miss
  // rank 0's roll call (1 s), and be named among the lost.
  std::vector<std::string> messages(2);
  double rank1_seconds = 0;
  require_no_errors(run_tcp_ranks(3, [&](Communicator& comm) {
    const int r = comm.rank();
    if (r == 2) return;
    const auto start = std::chrono::steady_clock::now();
    try {
      if (r == 0) comm.all_reduce(ones({10}))->wait();
      else comm.recv(zeros({10}), 0)->wait();
    } catch (const Error& e) {
      messages[size_t(r)] = e.what();
    }
    if (r == 1) rank1_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }, 4s));
  CAPTURE(messages[0]);
  CAPTURE(messages[1]);
  CHECK(contains(messages[0], "Rank 2 (on "));
  CHECK(contains(messages[0], "(ranks 0, 1 (on "));
  CHECK(contains(messages[1], "recv #0 (from rank 0, tag 0) of float32 [10] on rank 1 of 3 failed: A peer closed its "
                              "connection"));
  CHECK(rank1_seconds < 3);
}

TEST_CASE("destroying a communicator with queued work fails that work instead of hanging") {
  std::shared_ptr<Work> running, queued;
  require_no_errors(run_tcp_ranks(2, [&](Communicator& comm) {
    if (comm.rank() == 1) return;  // rank 1 leaves at once: rank 0's op cannot complete
    running = comm.all_reduce(zeros({1}));
    queued = comm.barrier();
  }, 600ms));
  REQUIRE(running);
  CHECK(running->is_completed());
  CHECK_THROWS_AS(running->wait(), Error);
  CHECK_THROWS_WITH_AS(queued->wait(), doctest::Contains("barrier #1"), Error);
}

TEST_CASE("a world of one, and arguments checked before anything moves") {
  require_no_errors(run_tcp_ranks(1, [&](Communicator& comm) {
    Tensor t = from_vector<float>({1, 2}, {2});
    comm.all_reduce(t, ReduceOp::Avg)->wait();
    CHECK(t.tolist<float>() == std::vector<float>{1, 2});
    std::vector<Tensor> out;
    comm.all_gather(out, t)->wait();
    CHECK(out.size() == 1);
    CHECK(out[0].tolist<float>() == std::vector<float>{1, 2});
    Tensor mine = zeros({2});
    comm.reduce_scatter(mine, {t})->wait();
    CHECK(mine.tolist<float>() == std::vector<float>{1, 2});
    comm.barrier()->wait();

    Tensor m = zeros({2, 3});
    CHECK_THROWS_WITH_AS(comm.all_reduce(m.t()), doctest::Contains("not contiguous"), Error);
    CHECK_THROWS_WITH_AS(comm.all_reduce(zeros({2}, kBool)), doctest::Contains("reduces float32, float64"), Error);
    CHECK_THROWS_WITH_AS(comm.all_reduce(zeros({2}, kInt64), ReduceOp::Avg), doctest::Contains("truncate"), Error);
    CHECK_THROWS_WITH_AS(comm.broadcast(t, 1), doctest::Contains("root rank in [0, 1)"), Error);
    std::vector<Tensor> two = {zeros({2}), zeros({2})};
    CHECK_THROWS_WITH_AS(comm.all_gather(two, t), doctest::Contains("world size is 1"), Error);
    std::vector<Tensor> wrong = {zeros({3})};
    CHECK_THROWS_WITH_AS(comm.all_gather(wrong, t), doctest::Contains("must match"), Error);
    CHECK_THROWS_WITH_AS(comm.send(t, 0), doctest::Contains("with itself"), Error);
    CHECK_THROWS_WITH_AS(comm.recv(t, 3), doctest::Contains("source rank in [0, 1)"), Error);
  }, 5s));
}
TEST_CASE("the default process group: a world of one through tcp://, and teaching errors") {
  CHECK_FALSE(is_initialized());
  CHECK(is_main_process());  // no group: a single-process run is its own main process
  CHECK_THROWS_WITH_AS(get_rank(), doctest::Contains("call loom::distributed::init_process_group() first"), Error);
  const std::string where = "tcp://127.0.0.1:" + std::to_string(net::find_free_port());
  if (!cuda::is_available())  // with a GPU, "nccl" works (tests/test_comm_nccl.cpp)
    CHECK_THROWS_WITH_AS(init_process_group("nccl", where, 5s, 0, 1), doctest::Contains("Use backend \"gloo\""), Error);
  CHECK_THROWS_WITH_AS(init_process_group("mpi", where, 5s, 0, 1), doctest::Contains("unknown backend"), Error);
  CHECK_THROWS_WITH_AS(init_process_group("gloo", "file:///tmp/x", 5s, 0, 1), doctest::Contains("env://"), Error);
  CHECK_THROWS_WITH_AS(init_process_group("gloo", where, 5s, 2, 1), doctest::Contains("RANK=2"), Error);
  init_process_group("gloo", where, 5s, /*rank=*/0, /*world_size=*/1);
  CHECK(is_initialized());
  CHECK(get_rank() == 0);
  CHECK(get_world_size() == 1);
  CHECK(is_main_process());
  CHECK(std::string(default_group()->backend()) == "gloo");
  Tensor t = full({2}, 3);
  all_reduce(t, ReduceOp::Max);
  broadcast(t, 0);
  barrier();
  CHECK(t.tolist<float>() == std::vector<float>{3, 3});
  CHECK_THROWS_WITH_AS(init_process_group("gloo", where, 5s, 0, 1), doctest::Contains("already initialized"), Error);
  destroy_process_group();
  CHECK_FALSE(is_initialized());
}
TEST_CASE("a gloo group ignores SIGPIPE unless the program chose otherwise (Note [Gloo's sockets and SIGPIPE])") {
  struct sigaction saved {};
  ::sigaction(SIGPIPE, nullptr, &saved);
  auto disposition = [] {
    struct sigaction now {};
    ::sigaction(SIGPIPE, nullptr, &now);
    return now.sa_handler;
  };
  auto make_group = [] {
    require_no_errors(run_tcp_ranks(1, [](Communicator&) {}));  // over TCP, as every group of this file
  };
  ::signal(SIGPIPE, SIG_DFL);
  make_group();
  CHECK((disposition() == SIG_IGN));  // a closed peer is then an error, not a silent death
  static void (*const handler)(int) = [](int) {};
  ::signal(SIGPIPE, handler);
  make_group();
  CHECK((disposition() == handler));  // the program's own handler stays
  ::sigaction(SIGPIPE, &saved, nullptr);
}
#endif  // LOOM_WITH_GLOO
