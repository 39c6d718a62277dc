// The shared-memory transport of the gloo backend (parallel/comm/shm_collectives.h):
// every collective against values computed here, on 2 and 3 ranks, in every supported
// dtype, at sizes that are empty, tiny, odd and many chunks long; its setup (one host,
// nothing left in /dev/shm) and its failures (ranks that disagree, a rank that never
// comes, a process that dies). Ranks are threads (one process: one host), except in the
// test where a rank is a child process that exits.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <thread>
#include <vector>

#include "core/factory.h"
#include "parallel/comm/shm_segment.h"
#include "collective_checks.h"  // defines: value, expected, values_of, loom_segments_in_dev_shm
#include "never_arrives.h"  // defines: NeverArrives

using namespace loom;
using namespace loom::distributed;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using loom::testing::expected;
using loom::testing::loom_segments_in_dev_shm;
using loom::testing::value;
using loom::testing::values_of;

TEST_CASE("host identity: hostname and boot id, the same on every call") {
  const std::string id = host_identity();
  CHECK(id == host_identity());
  CHECK(id.find('/') != std::string::npos);
  CHECK(id.size() > 2);
}

TEST_CASE("a segment is shared between mappings, and unlinking keeps the memory but frees the name") {
  const std::string name = unique_segment_name("test/segment");
  CHECK(name.rfind("/loom-", 0) == 0);
  CHECK(name.find('/', 1) == std::string::npos);  // one leading slash: a valid shm name
  auto a = SharedMemorySegment::create(name, 8192);
  auto b = SharedMemorySegment::open(name, 8192);
  static_cast<int*>(a.data())[100] = 42;
  CHECK(static_cast<int*>(b.data())[100] == 42);
  a.unlink();
  CHECK_FALSE(std::filesystem::exists("/dev/shm" + name));
  static_cast<int*>(b.data())[5] = 7;
  CHECK(static_cast<int*>(a.data())[5] == 7);
  CHECK_THROWS_WITH_AS(SharedMemorySegment::open(name, 8192), doctest::Contains("shm_open"), Error);
  CHECK_THROWS_WITH_AS(SharedMemorySegment::create(unique_segment_name("x"), 0), doctest::Contains("positive"), Error);
}

#ifdef LOOM_WITH_GLOO
#include "parallel/comm/gloo_communicator.h"
#include "rank_threads.h"  // defines: run_rank_threads, require_no_errors, contains

using loom::testing::contains;
using loom::testing::require_no_errors;

namespace {

struct RankSetup {
  std::chrono::milliseconds timeout = 10s;
  size_t staging_bytes = 4096;  // tiny: large tensors take many chunks (rounds)
  std::function<bool(int)> shared_memory = [](int) { return true; };
};

// Runs body(comm) on n ranks, one thread each; returns each rank's error ("" if none).
std::vector<std::string> run_ranks(int n, const std::function<void(GlooCommunicator&)>& body, RankSetup setup = {}) {
  return loom::testing::run_rank_threads(n, [&](int r, std::shared_ptr<TCPStore> store) {
    GlooOptions options;
    options.timeout = setup.timeout;
    options.shared_memory = setup.shared_memory(r);
    options.shm_staging_bytes = setup.staging_bytes;
    GlooCommunicator comm(store, "shm_group", r, n, options);
    body(comm);
  });
}

bool same_values(const Tensor& a, const Tensor& b) { return a.to(kFloat64).tolist<double>() == b.to(kFloat64).tolist<double>(); }

// 0, 1, odd, one element past a 4 KiB chunk of float32, and many chunks.
const std::vector<int64_t> kSizes = {0, 1, 17, 1025, 100003};
// The values are small integers, exact in every dtype, and so are their sums; only Avg
// rounds, at the precision of the dtype (16-bit floats: Note [Which dtypes the gloo
// backend reduces]).
const std::vector<DType> kReducedDtypes = {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64};
double tolerance(DType dtype) { return dtype == kFloat16 ? 1e-3 : dtype == kBFloat16 ? 8e-3 : 1e-6; }

}  // namespace

TEST_CASE("a rank whose process exits: the others fail within a second, naming it, long before the timeout") {
  // Rank 1 is a child process: forked before this process starts any thread of its
  // own (the store server is created after the fork), it learns the port via a pipe.
  int port_pipe[2];
  REQUIRE(::pipe(port_pipe) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::close(port_pipe[1]);
    int port = 0;
    if (::read(port_pipe[0], &port, sizeof(port)) != sizeof(port)) ::_exit(2);
    try {
      auto store = std::make_shared<TCPStore>("127.0.0.1", port, false, 20s);
      GlooOptions options;
      options.timeout = 20s;
      GlooCommunicator comm(store, "dying", 1, 2, options);
      comm.barrier()->wait();
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(0);  // leaves without calling the all_reduce rank 0 waits in
  }
  ::close(port_pipe[0]);
  auto server = std::make_shared<TCPStore>("127.0.0.1", 0, /*is_server=*/true, 20s);
  const int port = server->port();
  REQUIRE(::write(port_pipe[1], &port, sizeof(port)) == sizeof(port));
  ::close(port_pipe[1]);
  std::string message, transport;
  double seconds = 0;
  {
    GlooOptions options;
    options.timeout = 20s;
    GlooCommunicator comm(server, "dying", 0, 2, options);
    transport = comm.collective_transport();
    comm.barrier()->wait();
    int status = 0;
    ::waitpid(child, &status, 0);  // gone for sure
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    auto start = Clock::now();
    try {
      comm.all_reduce(zeros({10}))->wait();
    } catch (const Error& e) {
      message = e.what();
    }
    seconds = std::chrono::duration<double>(Clock::now() - start).count();
  }
  CHECK(transport == "shm");
  CAPTURE(message);
  CHECK(seconds < 2.0);
  CHECK(contains(message, "all_reduce #1 (sum) of float32 [10] on rank 0 of 2 failed: rank 1 (pid "));
  CHECK(contains(message, "exited"));
}

TEST_CASE("ranks on one host use shared memory, and leave nothing in /dev/shm") {
  const size_t before = loom_segments_in_dev_shm();
  std::vector<std::string> transport(3);
  size_t during = 0;
  require_no_errors(run_ranks(3, [&](GlooCommunicator& comm) {
    transport[comm.rank()] = comm.collective_transport();
    comm.barrier()->wait();  // every rank has mapped and rank 0 has unlinked by now
    if (comm.rank() == 0) during = loom_segments_in_dev_shm();
    comm.barrier()->wait();
  }));
  CHECK(transport == std::vector<std::string>{"shm", "shm", "shm"});
  CHECK(during == before);  // see Note [Unlink as soon as everyone has mapped]
  CHECK(loom_segments_in_dev_shm() == before);
}

TEST_CASE("one rank without shared memory: every rank falls back to TCP, saying why, and still works") {
  std::vector<std::string> transport(2), why(2);
  std::vector<float> sums(2);
  require_no_errors(run_ranks(2, [&](GlooCommunicator& comm) {
    transport[comm.rank()] = comm.collective_transport();
    why[comm.rank()] = comm.why_not_shared_memory();
    Tensor t = full({5}, comm.rank() + 1.0);
    comm.all_reduce(t)->wait();
    sums[comm.rank()] = t.tolist<float>()[4];
  }, {.shared_memory = [](int r) { return r != 1; }}));
  CHECK(transport == std::vector<std::string>{"tcp", "tcp"});
  CHECK(contains(why[0], "rank 1 has shared memory turned off"));
  CHECK(why[0] == why[1]);
  CHECK(sums == std::vector<float>{3, 3});
}

TEST_CASE("all_reduce: sum, avg, max, min; 2 and 3 ranks; six dtypes; sizes 0, 1, odd and many chunks") {
  for (int n : {2, 3}) {
    CAPTURE(n);
    std::vector<std::string> mismatches(n);
    require_no_errors(run_ranks(n, [&](GlooCommunicator& comm) {
      const int r = comm.rank();
      for (DType dtype : kReducedDtypes) {
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
          if (op == ReduceOp::Avg && !is_floating(dtype)) continue;
          for (int64_t size : kSizes) {
            Tensor t = values_of(r, size, dtype);
            comm.all_reduce(t, op)->wait();
            auto got = t.to(kFloat64).tolist<double>();
            for (int64_t i = 0; i < size; ++i) {
              const double want = expected(op, n, i);
              if (std::abs(got[size_t(i)] - want) > tolerance(dtype) * (1 + std::abs(want))) {
                if (mismatches[r].empty())  // the first one tells most
                  mismatches[r] = detail::str(dtype_name(dtype), " ", reduce_op_name(op), " size ", size, " [", i,
                                            "]: got ", got[size_t(i)], ", expected ", want);
                break;
              }
            }
          }
        }
      }
      Tensor u = from_vector<int64_t>({200, 1, 255}, {3}).to(kUInt8);  // sums wrap modulo 256, as PyTorch
      comm.all_reduce(u)->wait();
      if (u.to(kInt64).tolist<int64_t>() != std::vector<int64_t>{200 * n % 256, n, 255 * n % 256})
        mismatches[r] = "uint8 sum did not wrap modulo 256";
    }));
    for (int r = 0; r < n; ++r) CHECK_MESSAGE(mismatches[r].empty(), "rank ", r, ": ", mismatches[r]);
  }
}

TEST_CASE("all_reduce results are bitwise identical on every rank (each share is reduced by one rank)") {
  std::vector<std::vector<float>> got(3);
  std::vector<Tensor> inputs;  // on this thread: the default generator is not shared safely
  for (int r = 0; r < 3; ++r) inputs.push_back(randn({50001}).mul_(1.0 + r));
  require_no_errors(run_ranks(3, [&](GlooCommunicator& comm) {
    Tensor t = inputs[comm.rank()];
    comm.all_reduce(t, ReduceOp::Avg)->wait();
    got[comm.rank()] = t.tolist<float>();
  }));
  CHECK(got[0] == got[1]);
  CHECK(got[0] == got[2]);
}

TEST_CASE("broadcast from every root, all_gather and reduce_scatter; 2 and 3 ranks; sizes 0 to many chunks") {
  for (int n : {2, 3}) {
    CAPTURE(n);
    std::vector<std::string> mismatches(n);
    auto note = [&](int r, const std::string& what) {
      if (mismatches[r].empty()) mismatches[r] = what;
    };
    require_no_errors(run_ranks(n, [&](GlooCommunicator& comm) {
      const int r = comm.rank();
      for (DType dtype : kReducedDtypes) {
        for (int64_t size : kSizes) {
          for (int root = 0; root < n; ++root) {
            Tensor b = r == root ? values_of(root, size, dtype) : zeros({size}, TensorOptions(dtype));
            comm.broadcast(b, root)->wait();
            if (!same_values(b, values_of(root, size, kFloat64)))
              note(r, detail::str("broadcast ", dtype_name(dtype), " size ", size, " root ", root));
          }
          std::vector<Tensor> gathered;
          comm.all_gather(gathered, values_of(r, size, dtype))->wait();
          for (int p = 0; p < n; ++p)
            if (!same_values(gathered[p], values_of(p, size, kFloat64)))
              note(r, detail::str("all_gather ", dtype_name(dtype), " size ", size, " from rank ", p));
          for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg}) {
            if (op == ReduceOp::Avg && !is_floating(dtype)) continue;
            // in[p] on rank r holds value(r, i + p * size): rank p's output is the op
            // over ranks of element i + p * size.
            std::vector<Tensor> in;
            for (int p = 0; p < n; ++p) in.push_back(values_of(r, size, dtype, p * size));
            Tensor out = zeros({size}, TensorOptions(dtype));
            comm.reduce_scatter(out, in, op)->wait();
            auto got = out.to(kFloat64).tolist<double>();
            for (int64_t i = 0; i < size; ++i) {
              const double want = expected(op, n, i + r * size);
              if (std::abs(got[size_t(i)] - want) > tolerance(dtype) * (1 + std::abs(want))) {
                note(r, detail::str("reduce_scatter ", dtype_name(dtype), " ", reduce_op_name(op), " size ", size,
                                    " [", i, "]"));
                break;
              }
            }
          }
        }
      }
      comm.barrier()->wait();
    }));
    for (int r = 0; r < n; ++r) CHECK_MESSAGE(mismatches[r].empty(), "rank ", r, ": ", mismatches[r]);
  }
}

TEST_CASE("barrier waits for the slowest rank; operations stay asynchronous") {
  std::vector<double> waited(3);
  bool completed_early = true;
  require_no_errors(run_ranks(3, [&](GlooCommunicator& comm) {
    if (comm.rank() == 2) std::this_thread::sleep_for(300ms);
    auto start = Clock::now();
    auto work = comm.barrier();
    if (comm.rank() == 0) completed_early = work->is_completed();
    work->wait();
    waited[comm.rank()] = std::chrono::duration<double>(Clock::now() - start).count();
  }));
  CHECK_FALSE(completed_early);
  CHECK(waited[0] >= 0.2);
  CHECK(waited[1] >= 0.2);
}

TEST_CASE("ranks that disagree get the same clear error; nothing moved and the group goes on") {
  std::vector<std::string> messages(2);
  std::vector<float> after(2);
  require_no_errors(run_ranks(2, [&](GlooCommunicator& comm) {
    const int r = comm.rank();
    try {
      comm.all_reduce(zeros({r == 0 ? 4 : 5}))->wait();
    } catch (const Error& e) {
      messages[r] = e.what();
    }
    Tensor t = full({3}, 1.0);
    comm.all_reduce(t)->wait();
    after[r] = t.tolist<float>()[2];
  }));
  for (const auto& m : messages) {
    CAPTURE(m);
    CHECK(contains(m, "all_reduce(sum) of float32 [4] on rank 0"));
    CHECK(contains(m, "all_reduce(sum) of float32 [5] on rank 1"));
  }
  CHECK(after == std::vector<float>{2, 2});
}

TEST_CASE("a rank that never arrives: timeout naming the rank, op, number and shape; then the group is unusable") {
  loom::testing::NeverArrives seen;
  require_no_errors(run_ranks(2, [&](GlooCommunicator& comm) { seen.run(comm, 1500ms, {}); }, {.timeout = 700ms}));
  seen.check(700ms, "waiting for rank 1", /*at_most_seconds=*/3.0);
}

#endif  // LOOM_WITH_GLOO
