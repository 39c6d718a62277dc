// Communicator with the Gloo backend. Each rank is a thread with its own store client
// and communicator, talking over real TCP on 127.0.0.1, so every test is a genuine
// multi-rank run inside one process. Errors, timeouts and faults: test_comm_gloo_errors.cpp.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>
#include <vector>

#include "core/factory.h"
#include "cuda/device.h"  // defines: is_available
#include "parallel/comm/communicator.h"

using namespace loom;
using namespace loom::distributed;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

static Op op_for(OpKind kind, Tensor t, ReduceOp reduce = ReduceOp::Sum) {
  Op op;
  op.kind = kind;
  op.reduce = reduce;
  op.tensor = std::move(t);
  op.size = 3;
  return op;
}

TEST_CASE("fingerprints: agreement, and a disagreement message that groups ranks by call") {
  Op a = op_for(OpKind::AllReduce, zeros({4}));
  Op b = op_for(OpKind::AllReduce, zeros({5}));
  CHECK(fingerprint(a).str() == "all_reduce(sum) of float32 [4]");
  check_same_collective({fingerprint(a), fingerprint(a), fingerprint(a)}, a);
  CHECK_FALSE(fingerprint(a).same_collective(fingerprint(op_for(OpKind::AllReduce, zeros({4}), ReduceOp::Max))));
  CHECK(fingerprint(a).same_tensor(fingerprint(op_for(OpKind::Send, zeros({4})))));
  CHECK_FALSE(fingerprint(a).same_tensor(fingerprint(op_for(OpKind::Send, zeros({4}, kFloat64)))));
  try {
    check_same_collective({fingerprint(a), fingerprint(b), fingerprint(a)}, a);
    FAIL("expected an error");
  } catch (const Error& e) {
    std::string m = e.what();
    CHECK(m.find("all_reduce(sum) of float32 [4] on ranks 0, 2") != std::string::npos);
    CHECK(m.find("all_reduce(sum) of float32 [5] on rank 1") != std::string::npos);
  }
}

TEST_CASE("Work::awaited: true once a thread waits before the end; the callback runs once, under the lock") {
  // What Note [Whoever waits reduces] (shm_collectives.h) relies on to wake a late rank.
  Work work("all_reduce #1 (sum) of float32 [4] on rank 0 of 2");
  std::atomic<int> calls{0};
  work.on_awaited([&] { ++calls; });
  CHECK_FALSE(work.awaited());
  std::thread waiter([&] { work.wait(); });
  const auto give_up = Clock::now() + 10s;
  while (!work.awaited() && Clock::now() < give_up) std::this_thread::sleep_for(1ms);
  CHECK(work.awaited());
  CHECK(calls.load() == 1);
  std::thread second([&] { work.wait(); });  // a second waiter does not call it again
  std::this_thread::sleep_for(20ms);
  work.on_awaited(nullptr);
  work.finish();
  waiter.join();
  second.join();
  CHECK(calls.load() == 1);

  Work done("barrier #2 on rank 0 of 2");  // waiting on a finished Work: not "awaited"
  done.on_awaited([&] { ++calls; });
  done.finish();
  done.wait();
  CHECK_FALSE(done.awaited());
  CHECK(calls.load() == 1);
}

#ifdef LOOM_WITH_GLOO
#include "parallel/comm/gloo_communicator.h"
#include "parallel/comm/host_staging.h"

#include "gloo_tcp_ranks.h"  // defines: run_tcp_ranks
#include "rank_threads.h"    // defines: require_no_errors, contains

using loom::testing::contains;
using loom::testing::require_no_errors;
using loom::testing::run_tcp_ranks;

TEST_CASE("all_reduce sum, avg, max and min on 2 and 3 ranks, in three dtypes") {
  for (int n : {2, 3}) {
    CAPTURE(n);
    std::vector<std::vector<std::vector<double>>> got(n);
    require_no_errors(run_tcp_ranks(n, [&](Communicator& comm) {
      const double r = comm.rank();
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
        Tensor t = from_vector<float>({float(r + 1), float(-10 * r), 0.5f}, {3});
        comm.all_reduce(t, op)->wait();
        auto v = t.tolist<float>();
        got[comm.rank()].push_back({v.begin(), v.end()});
      }
      Tensor d = from_vector<double>({r / 3, 1e-12}, {2});
      comm.all_reduce(d)->wait();
      got[comm.rank()].push_back(d.tolist<double>());
      Tensor i = from_vector<int64_t>({int64_t(r) << 40, 7}, {2});
      comm.all_reduce(i, ReduceOp::Max)->wait();
      got[comm.rank()].push_back({double(i.tolist<int64_t>()[0]), double(i.tolist<int64_t>()[1])});
    }));
    const double sum_r = n * (n - 1) / 2.0;
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      CHECK(got[r][0] == std::vector<double>{sum_r + n, -10 * sum_r, 0.5 * n});
      CHECK(got[r][1][0] == doctest::Approx((sum_r + n) / n));
      CHECK(got[r][1][1] == doctest::Approx(-10 * sum_r / n));
      CHECK(got[r][2] == std::vector<double>{double(n), 0, 0.5});
      CHECK(got[r][3] == std::vector<double>{1, -10.0 * (n - 1), 0.5});
      CHECK(got[r][4][0] == doctest::Approx(sum_r / 3));
      CHECK(got[r][4][1] == doctest::Approx(n * 1e-12));
      CHECK(got[r][5] == std::vector<double>{double(int64_t(n - 1) << 40), 7});
    }
  }
}

TEST_CASE("broadcast, all_gather and reduce_scatter on 3 ranks") {
  const int n = 3;
  std::vector<std::vector<double>> broadcast_got(n), reduced(n);
  std::vector<std::vector<std::vector<int64_t>>> gathered(n);
  require_no_errors(run_tcp_ranks(n, [&](Communicator& comm) {
    const int r = comm.rank();
    Tensor b = r == 2 ? from_vector<double>({3.5, -1}, {2, 1}) : zeros({2, 1}, kFloat64);
    comm.broadcast(b, /*root=*/2)->wait();
    broadcast_got[r] = b.tolist<double>();

    std::vector<Tensor> out;  // empty: all_gather allocates one tensor per rank
    comm.all_gather(out, from_vector<int64_t>({r, 10 * r}, {2}))->wait();
    for (auto& t : out) gathered[r].push_back(t.tolist<int64_t>());

    std::vector<Tensor> in;
    for (int dst = 0; dst < n; ++dst) in.push_back(from_vector<float>({float(100 * dst + r), 1}, {2}));
    Tensor mine = zeros({2});
    comm.reduce_scatter(mine, in, ReduceOp::Avg)->wait();
    reduced[r] = {double(mine.tolist<float>()[0]), double(mine.tolist<float>()[1])};
  }));
  for (int r = 0; r < n; ++r) {
    CHECK(broadcast_got[r] == std::vector<double>{3.5, -1});
    CHECK(gathered[r] == std::vector<std::vector<int64_t>>{{0, 0}, {1, 10}, {2, 20}});
    CHECK(reduced[r][0] == doctest::Approx((3 * 100.0 * r + 0 + 1 + 2) / 3));
    CHECK(reduced[r][1] == doctest::Approx(1));
  }
}

TEST_CASE("float16, bfloat16 and uint8 reduce (uint8 sums wrap); bool and every dtype broadcast and all_gather") {
  const int n = 3;
  std::vector<std::vector<double>> got(n);
  std::vector<std::vector<int64_t>> wrapped(n);
  std::vector<std::vector<bool>> flags(n), gathered_flags(n);
  require_no_errors(run_tcp_ranks(n, [&](Communicator& comm) {
    const int r = comm.rank();
    for (DType dtype : {kFloat16, kBFloat16}) {
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
        Tensor t = from_vector<float>({float(r + 1), float(-4 * r), 0.5f}, {3}).to(dtype);
        comm.all_reduce(t, op)->wait();
        CHECK(t.dtype() == dtype);
        for (double v : t.to(kFloat64).tolist<double>()) got[r].push_back(v);
      }
    }
    Tensor u = from_vector<int64_t>({200, 1, 255}, {3}).to(kUInt8);
    comm.all_reduce(u)->wait();  // 600 and 765 wrap modulo 256, as in PyTorch
    wrapped[r] = u.to(kInt64).tolist<int64_t>();
    Tensor b = from_vector<int64_t>({r == 1, 1, 0}, {3}).to(kBool);
    comm.broadcast(b, /*root=*/1)->wait();
    for (int64_t v : b.to(kInt64).tolist<int64_t>()) flags[r].push_back(v != 0);
    std::vector<Tensor> out;
    comm.all_gather(out, from_vector<int64_t>({r == 2}, {1}).to(kBool))->wait();
    for (auto& t : out) gathered_flags[r].push_back(t.to(kInt64).tolist<int64_t>()[0] != 0);
    CHECK_THROWS_WITH_AS(comm.all_reduce(zeros({2}, kBool)), doctest::Contains("reduces float32, float64, float16, "
                         "bfloat16, int32, int64 and uint8 tensors, got bool"), Error);
  }));
  // Per dtype: Sum, Avg, Max, Min of {r + 1, -4r, 0.5} over ranks 0, 1, 2: exact in 16 bits.
  const std::vector<double> per_dtype = {6, -12, 1.5, 2, -4, 0.5, 3, 0, 0.5, 1, -8, 0.5};
  std::vector<double> want = per_dtype;
  want.insert(want.end(), per_dtype.begin(), per_dtype.end());
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    CHECK(got[r] == want);
    CHECK(wrapped[r] == std::vector<int64_t>{600 % 256, 3, 765 % 256});
    CHECK(flags[r] == std::vector<bool>{true, true, false});
    CHECK(gathered_flags[r] == std::vector<bool>{false, false, true});
  }
}

TEST_CASE("TCP and shared memory reduce bitwise alike on 2, 3 and 4 ranks, in every floating dtype") {
  // Note [A rank-ordered all_reduce over TCP]: both transports add every element's values
  // in rank order with one kernel, so a job's results do not depend on whether its ranks
  // share a host. Random values make the order and the rounding matter; 4099 elements cut
  // into unequal shares, 2 into fewer elements than ranks.
  for (int n : {2, 3, 4}) {
    for (DType dtype : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
      for (int64_t numel : {4099, 2}) {
        CAPTURE(n);
        CAPTURE(dtype_name(dtype));
        CAPTURE(numel);
        std::vector<Tensor> inputs;
        std::vector<std::vector<Tensor>> pieces(static_cast<size_t>(n));  // reduce_scatter: rank r's n inputs of 3
        for (int r = 0; r < n; ++r) {
          inputs.push_back(randn({numel}).mul_(float(1 + 3 * r)).to(dtype));
          for (int p = 0; p < n; ++p) pieces[size_t(r)].push_back(randn({3}).to(dtype));
        }
        std::vector<std::vector<double>> results[2];  // [shared memory][rank]: sum, avg, then reduce_scatter
        for (bool shm : {false, true}) {
          results[shm].resize(size_t(n));
          require_no_errors(loom::testing::run_rank_threads(n, [&](int r, std::shared_ptr<TCPStore> store) {
            GlooOptions options;
            options.shared_memory = shm;
            GlooCommunicator comm(store, "agree", r, n, options);
            CHECK(std::string(comm.collective_transport()) == (shm ? "shm" : "tcp"));
            auto& out = results[shm][size_t(r)];
            for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
              Tensor t = inputs[size_t(r)].clone();
              comm.all_reduce(t, op)->wait();
              for (double v : t.to(kFloat64).tolist<double>()) out.push_back(v);
            }
            Tensor mine = zeros({3}, TensorOptions(dtype));
            comm.reduce_scatter(mine, pieces[size_t(r)])->wait();
            for (double v : mine.to(kFloat64).tolist<double>()) out.push_back(v);
          }));
        }
        for (int r = 0; r < n; ++r) CHECK(results[0][size_t(r)] == results[1][size_t(r)]);
        for (int r = 1; r < n; ++r)  // all_reduce: the same on every rank (reduce_scatter's shares differ)
          CHECK(std::vector<double>(results[0][0].begin(), results[0][0].begin() + 2 * numel) ==
                std::vector<double>(results[0][size_t(r)].begin(), results[0][size_t(r)].begin() + 2 * numel));
        // And the sum is the float32 sum in rank order, rounded once.
        if (dtype != kFloat64) {
          Tensor acc = inputs[0].to(kFloat32);
          for (int r = 1; r < n; ++r) acc = acc.add(inputs[size_t(r)].to(kFloat32));
          Tensor want = acc.to(dtype).to(kFloat64);
          CHECK(std::vector<double>(results[0][0].begin(), results[0][0].begin() + numel) == want.tolist<double>());
        }
      }
    }
  }
}

TEST_CASE("send and recv: a ring where everyone sends first, and in-order messages on one tag") {
  const int n = 3;
  std::vector<std::vector<float>> from_left(n), ordered(n);
  require_no_errors(run_tcp_ranks(n, [&](Communicator& comm) {
    const int r = comm.rank();
    Tensor out = full({3}, r), in = zeros({3});
    // Everyone waits for its send first: fine, because the recvs were posted already
    // (a send completes once its receiver has posted the recv; see Note [Point-to-point
    // in Gloo]).
    auto sent = comm.send(out, (r + 1) % n, /*tag=*/7);
    auto received = comm.recv(in, (r + n - 1) % n, 7);
    sent->wait();
    received->wait();
    from_left[r] = in.tolist<float>();
    if (r == 0) {
      auto first = comm.send(full({1}, 1.0), 1, 3), second = comm.send(full({1}, 2.0), 1, 3);
      first->wait();
      second->wait();
    } else if (r == 1) {
      Tensor a = zeros({1}), b = zeros({1});
      auto wa = comm.recv(a, 0, 3), wb = comm.recv(b, 0, 3);
      wb->wait();
      wa->wait();
      ordered[r] = {a.item<float>(), b.item<float>()};
    }
  }));
  for (int r = 0; r < n; ++r) CHECK(from_left[r] == std::vector<float>(3, float((r + n - 1) % n)));
  CHECK(ordered[1] == std::vector<float>{1, 2});
}

TEST_CASE("point-to-point runs while collectives are in flight, with and without the fingerprint check") {
  for (bool verify : {true, false}) {
    CAPTURE(verify);
    std::vector<float> sums(2), received(2);
    require_no_errors(run_tcp_ranks(2, [&](Communicator& comm) {
      const int r = comm.rank(), peer = 1 - r;
      Tensor big = full({100000}, r + 1), mine = full({7}, 10 * r), theirs = zeros({7});
      auto reduce = comm.all_reduce(big);
      auto sent = comm.send(mine, peer, 1);
      auto got = comm.recv(theirs, peer, 1);
      auto barrier = comm.barrier();
      sent->wait();
      got->wait();
      reduce->wait();
      barrier->wait();
      sums[r] = big.tolist<float>()[99999];
      received[r] = theirs.tolist<float>()[6];
    }, 10s, 1, verify));
    CHECK(sums == std::vector<float>{3, 3});
    CHECK(received == std::vector<float>{10, 0});
  }
}

TEST_CASE("barrier waits for the slowest rank") {
  std::vector<double> waited(3);
  require_no_errors(run_tcp_ranks(3, [&](Communicator& comm) {
    if (comm.rank() == 2) std::this_thread::sleep_for(300ms);
    auto start = Clock::now();
    comm.barrier()->wait();
    waited[comm.rank()] = std::chrono::duration<double>(Clock::now() - start).count();
  }));
  CHECK(waited[0] >= 0.2);
  CHECK(waited[1] >= 0.2);
}

TEST_CASE("operations are asynchronous: two outstanding all_reduces while the caller computes") {
  double issue_seconds = 1;
  bool completed_early = true;
  std::vector<float> a_got, b_got;
  require_no_errors(run_tcp_ranks(2, [&](Communicator& comm) {
    Tensor a = full({1000}, comm.rank() + 1), b = full({10}, 10.0 * (comm.rank() + 1));
    if (comm.rank() == 1) {
      std::this_thread::sleep_for(300ms);  // rank 0 must not be blocked meanwhile
      comm.all_reduce(a);
      comm.all_reduce(b, ReduceOp::Max)->wait();
      return;
    }
    auto start = Clock::now();
    auto wa = comm.all_reduce(a), wb = comm.all_reduce(b, ReduceOp::Max);
    issue_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    completed_early = wa->is_completed() || wb->is_completed();
    wb->wait();  // in reverse order: still fine
    wa->wait();
    CHECK(wa->is_success());
    a_got = a.tolist<float>();
    b_got = b.tolist<float>();
  }));
  CHECK(issue_seconds < 0.1);
  CHECK_FALSE(completed_early);
  CHECK(a_got == std::vector<float>(1000, 3));
  CHECK(b_got == std::vector<float>(10, 20));
}

TEST_CASE("several communicators share one store under different prefixes") {
  std::vector<float> got(2);
  require_no_errors(run_tcp_ranks(2, [&](Communicator& comm) {
    Tensor t = ones({1});
    comm.all_reduce(t)->wait();
    got[comm.rank()] += t.item<float>();
  }, 5s, /*groups=*/3));
  CHECK(got == std::vector<float>{6, 6});
}

// Note [CUDA tensors through gloo]: the bookkeeping of host staging, exercised on the CPU
// with cpu:1 as the "host" (what changes on a GPU is only which copy kernel runs).
TEST_CASE("host staging: inputs copied, outputs allocated and copied back, for every kind of operation") {
  const Device host("cpu:1");
  struct Case {
    OpKind kind;
    bool tensor_is_output, list_is_output;
    int list_size;
  };
  for (Case c : {Case{OpKind::AllReduce, true, false, 0}, Case{OpKind::Broadcast, true, false, 0},
                 Case{OpKind::AllGather, false, true, 3}, Case{OpKind::ReduceScatter, true, false, 3},
                 Case{OpKind::Send, false, false, 0}, Case{OpKind::Recv, true, false, 0}}) {
    CAPTURE(op_kind_name(c.kind));
    Op op;
    op.kind = c.kind;
    op.tensor = full({2, 3}, 1.0);
    for (int i = 0; i < c.list_size; ++i) op.list.push_back(full({2, 3}, 10.0 + i));
    CHECK_FALSE(needs_host_staging(op));  // CPU tensors: gloo moves them as they are
    HostStaged staged = stage_on_host(op, host);
    REQUIRE(staged.op.tensor.device() == host);
    CHECK_FALSE(staged.op.tensor.is_same(op.tensor));
    if (!c.tensor_is_output) CHECK(staged.op.tensor.sum().item<float>() == 6.0f);  // an input: copied
    for (int i = 0; i < c.list_size; ++i) {
      CHECK(staged.op.list[i].device() == host);
      if (!c.list_is_output) CHECK(staged.op.list[i].sum().item<float>() == 6.0f * float(10 + i));
    }
    const size_t outputs = (c.tensor_is_output ? 1u : 0u) + (c.list_is_output ? size_t(c.list_size) : 0u);
    CHECK(staged.results.size() == outputs);
    // The "collective" writes every stand-in; only outputs reach the caller's tensors.
    staged.op.tensor.fill_(7.0);
    for (Tensor& t : staged.op.list) t.fill_(8.0);
    copy_results_back(staged);
    CHECK(op.tensor.sum().item<float>() == (c.tensor_is_output ? 42.0f : 6.0f));
    for (int i = 0; i < c.list_size; ++i)
      CHECK(op.list[i].sum().item<float>() == (c.list_is_output ? 48.0f : 6.0f * float(10 + i)));
  }
}

TEST_CASE("CUDA tensors through gloo: all_reduce, broadcast, all_gather on 2 ranks match the CPU" *
          doctest::skip(!cuda::is_available())) {
  std::vector<std::vector<float>> reduced(2), broadcasted(2), gathered(2);
  require_no_errors(run_tcp_ranks(2, [&](Communicator& comm) {
    const int r = comm.rank();
    const TensorOptions on_gpu = TensorOptions().device(Device("cuda:0"));
    Tensor a = full({1000}, r + 1.0, on_gpu);
    comm.all_reduce(a)->wait();
    reduced[r] = a.to(Device("cpu")).tolist<float>();
    Tensor b = full({3}, 5.0 * r, on_gpu);
    comm.broadcast(b, 1)->wait();
    broadcasted[r] = b.to(Device("cpu")).tolist<float>();
    std::vector<Tensor> out;
    comm.all_gather(out, full({2}, r + 0.5, on_gpu))->wait();
    for (const Tensor& t : out) {
      CHECK(t.device().is_cuda());
      for (float v : t.to(Device("cpu")).tolist<float>()) gathered[r].push_back(v);
    }
    CHECK_THROWS_WITH_AS(comm.send(a, 1 - r), doctest::Contains("nccl backend for CUDA send/recv"), Error);
  }));
  for (int r = 0; r < 2; ++r) {
    CHECK(reduced[r] == std::vector<float>(1000, 3.0f));
    CHECK(broadcasted[r] == std::vector<float>(3, 5.0f));
    CHECK(gathered[r] == std::vector<float>{0.5f, 0.5f, 1.5f, 1.5f});
  }
}
#endif  // LOOM_WITH_GLOO
