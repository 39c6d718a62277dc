// Communicator with the NCCL backend, and the store-carried fingerprints it uses.
//
// Each rank is a thread with its own store client, communicator and GPU (rank r drives
// cuda:r), so a multi-rank run happens inside one process. Without a GPU (or in a build
// without NCCL) the GPU cases are *skipped* -- they show in doctest's "skipped" count,
// and the case "NCCL availability" prints why -- while the store fingerprints and the
// no-GPU teaching errors run.
//
// What only a GPU run can confirm (the NCCL backend was written and compiled on a
// machine without one; everything below is what these cases check there):
// - the NCCL calls themselves: dtype and reduce-op mapping (float16 / bfloat16 sums,
//   ncclAvg), in-place broadcast, all_gather by fused broadcasts and by ncclAllGather on
//   a flat list, reduce_scatter with and without the staging copy, send / recv groups;
// - non-blocking communicators: ncclCommInitRankConfig with blocking = 0 settled by
//   polling, a missing rank at construction timing out and aborting cleanly, and
//   ncclCommFinalize + ncclCommDestroy at destruction;
// - stream order: the communication stream waits for the compute stream's writes, and
//   Work::wait() orders the compute stream after the operation without blocking the host;
// - the watchdog: a rank that never comes (with verification off) ends in ncclCommAbort
//   within about the timeout, the Work fails naming rank / op / number / dtype / shape,
//   and the communicator refuses later operations;
// - record_stream of the operation's tensors on the communication stream (a tensor
//   dropped right after all_reduce; not observable by value, exercised only).
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <thread>
#include <vector>

#include "core/copy.h"
#include "core/factory.h"
#include "cuda/device.h"  // defines: device_count, unavailable_reason
#include "parallel/comm/communicator.h"
#include "parallel/comm/process_group.h"
#include "parallel/comm/store_fingerprints.h"
#include "parallel/store/socket.h"
#include "rank_threads.h"  // defines: require_no_errors, contains
#include "never_arrives.h"  // defines: NeverArrives

using namespace loom;
using namespace loom::distributed;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using loom::testing::contains;
using loom::testing::require_no_errors;

namespace {

#ifdef LOOM_WITH_NCCL
constexpr bool kNcclBuilt = true;
#else
constexpr bool kNcclBuilt = false;
#endif
// Evaluated at static initialisation, before the TEST_CASEs below register.
const int kGpus = kNcclBuilt ? cuda::device_count() : 0;

// Runs body(rank, store) on `n` threads, each with its own client of one store (as
// rank_threads.h's run_ranks, one level lower: the ranks make their own communicator).
std::vector<std::string> run_threads(int n, const std::function<void(int, std::shared_ptr<TCPStore>)>& body) {
  auto server = std::make_shared<TCPStore>("127.0.0.1", 0, /*is_server=*/true, 20s);
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r, r == 0 ? server : std::make_shared<TCPStore>("127.0.0.1", server->port(), false, 20s));
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

Op op_for(OpKind kind, Tensor t, int rank, int size, uint64_t seq = 0) {
  Op op;
  op.kind = kind;
  op.tensor = std::move(t);
  op.rank = rank;
  op.size = size;
  op.seq = seq;
  return op;
}

}  // namespace

TEST_CASE("NCCL availability") {
  if (!kNcclBuilt) MESSAGE("NCCL cases are skipped: this loom was built without NCCL");
  else if (kGpus == 0) MESSAGE("NCCL cases are skipped: ", cuda::unavailable_reason());
  else if (kGpus == 1) MESSAGE("1 GPU: the world-of-one cases run; the 2-rank cases are skipped");
  else MESSAGE(kGpus, " GPUs: every NCCL case runs (2 ranks on cuda:0 and cuda:1)");
}

// ---- every build, every machine ------------------------------------------------------------

TEST_CASE("store fingerprints: every rank sees every fingerprint, mismatches and all; keys are cleaned up") {
  std::vector<std::string> mismatch(3);
  auto errors = run_threads(3, [&](int rank, std::shared_ptr<TCPStore> store) {
    StoreFingerprints fp(store, "g", rank, 3);
    const auto deadline = Clock::now() + 10s;
    for (uint64_t seq = 0; seq < 4; ++seq) {
      auto gathered = fp.gather(op_for(OpKind::AllReduce, zeros({4, 2}), rank, 3, seq), deadline);
      LOOM_CHECK(gathered.missing.empty(), "rank ", rank, " found ranks missing at collective ", seq);
      check_same_collective(gathered.all, op_for(OpKind::AllReduce, zeros({4, 2}), rank, 3, seq));
    }
    Tensor odd = rank == 1 ? zeros({5}) : zeros({4});
    Op op = op_for(OpKind::AllReduce, odd, rank, 3, 4);
    try {
      check_same_collective(fp.gather(op, deadline).all, op);
    } catch (const Error& e) {
      mismatch[rank] = e.what();
    }
  });
  require_no_errors(errors);
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    CHECK(contains(mismatch[r], "all_reduce(sum) of float32 [4] on ranks 0, 2"));
    CHECK(contains(mismatch[r], "all_reduce(sum) of float32 [5] on rank 1"));
  }
}

TEST_CASE("store fingerprints: a missing rank is reported by the deadline, not waited for") {
  std::vector<int> missing;
  double seconds = 0;
  require_no_errors(run_threads(3, [&](int rank, std::shared_ptr<TCPStore> store) {
    if (rank == 2) return;  // never arrives
    StoreFingerprints fp(store, "g", rank, 3);
    auto start = Clock::now();
    auto gathered = fp.gather(op_for(OpKind::Barrier, Tensor(), rank, 3), start + 300ms);
    if (rank == 0) {
      missing = gathered.missing;
      seconds = std::chrono::duration<double>(Clock::now() - start).count();
    }
  }));
  CHECK(missing == std::vector<int>{2});
  CHECK(seconds < 2.0);
}

TEST_CASE("store fingerprints: point-to-point headers arrive in order, with dtype, shape and tag") {
  std::vector<Fingerprint> got;
  bool timed_out = false;
  require_no_errors(run_threads(2, [&](int rank, std::shared_ptr<TCPStore> store) {
    StoreFingerprints fp(store, "g", rank, 2);
    if (rank == 0) {
      Op a = op_for(OpKind::Send, zeros({3}), 0, 2), b = op_for(OpKind::Send, zeros({2, 2}, kInt64), 0, 2);
      a.peer = b.peer = 1;
      b.tag = 7;
      fp.post_header(a);
      fp.post_header(b);
      return;
    }
    Op recv = op_for(OpKind::Recv, zeros({3}), 1, 2);
    recv.peer = 0;
    for (int i = 0; i < 3; ++i) {
      auto header = fp.take_header(recv, Clock::now() + (i < 2 ? 5000ms : 200ms));
      if (header) got.push_back(*header);
      else timed_out = true;
    }
  }));
  REQUIRE(got.size() == 2);
  CHECK(got[0].tensor_str() == "float32 [3]");
  CHECK(got[0].id() == 0);
  CHECK(got[1].tensor_str() == "int64 [2, 2]");
  CHECK(got[1].id() == 7);
  CHECK(timed_out);  // a third message was never sent
}

TEST_CASE("a Work of a host backend: synchronize() is wait()") {
  Work work("all_reduce #0 on rank 0 of 1");
  work.finish();
  work.synchronize();
  Work failed("barrier #1 on rank 0 of 1");
  failed.finish(std::make_exception_ptr(Error("it broke")));
  CHECK_THROWS_WITH_AS(failed.synchronize(), "it broke", Error);
}

TEST_CASE("backend \"nccl\" without a GPU is a teaching error" * doctest::skip(kGpus > 0)) {
  const std::string where = "tcp://127.0.0.1:" + std::to_string(net::find_free_port());
  std::string message;
  try {
    init_process_group("nccl", where, 5s, 0, 1);
  } catch (const Error& e) {
    message = e.what();
  }
  MESSAGE("init_process_group(\"nccl\") says: ", message);
  CHECK(contains(message, "Use backend \"gloo\""));
  if (kNcclBuilt) CHECK(contains(message, "needs a CUDA GPU"));
  CHECK_FALSE(is_initialized());
}

// ---- with GPUs -----------------------------------------------------------------------------
#ifdef LOOM_WITH_NCCL
#include "parallel/comm/nccl_communicator.h"

namespace {

Tensor on_gpu(const std::vector<double>& values, DType dtype, int device) {
  Tensor cpu = from_vector<double>(values, {static_cast<int64_t>(values.size())});
  Tensor out = empty(cpu.shape(), TensorOptions(dtype).device(Device(DeviceType::CUDA, device)));
  copy_into(out, cpu);
  return out;
}

// Copied to the host on the current stream: ordered after a waited-for operation.
std::vector<double> host(const Tensor& t) {
  Tensor out = empty(t.shape(), TensorOptions(kFloat64));
  copy_into(out, t);
  return out.tolist<double>();
}

// Runs body(comm) on `n` ranks, rank r driving cuda:r.
std::vector<std::string> run_ranks(int n, const std::function<void(NcclCommunicator&)>& body,
                                   std::chrono::milliseconds timeout = 20s, bool verify = true) {
  return run_threads(n, [&](int rank, std::shared_ptr<TCPStore> store) {
    NcclOptions options;
    options.timeout = timeout;
    options.verify_collectives = verify;
    NcclCommunicator comm(store, "nccl_test", rank, n, /*device=*/rank, options);
    body(comm);
  });
}

const std::vector<DType> kReducible = {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kUInt8};

}  // namespace

TEST_CASE("a world of one: every operation and dtype, and arguments refused with a lesson" *
          doctest::skip(kGpus < 1)) {
  require_no_errors(run_ranks(1, [](NcclCommunicator& comm) {
    CHECK(std::string(comm.backend()) == "nccl");
    for (DType dtype : kReducible) {
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
        if (op == ReduceOp::Avg && !is_floating(dtype)) continue;
        CAPTURE(dtype_name(dtype));
        Tensor t = on_gpu({1, 2, 3}, dtype, 0);
        comm.all_reduce(t, op)->wait();
        CHECK(host(t) == std::vector<double>{1, 2, 3});
      }
    }
    Tensor b = on_gpu({4, 5}, kFloat32, 0);
    comm.broadcast(b, 0)->wait();
    CHECK(host(b) == std::vector<double>{4, 5});
    Tensor mask = on_gpu({1, 0}, kBool, 0);
    comm.broadcast(mask, 0)->wait();  // bool moves; it is only not reduced
    std::vector<Tensor> out;
    comm.all_gather(out, b)->wait();
    REQUIRE(out.size() == 1);
    CHECK(host(out[0]) == std::vector<double>{4, 5});
    Tensor mine = on_gpu({0, 0}, kFloat32, 0);
    comm.reduce_scatter(mine, {b})->wait();
    CHECK(host(mine) == std::vector<double>{4, 5});
    Tensor empty_one = on_gpu({}, kFloat32, 0);
    comm.all_reduce(empty_one)->wait();
    auto barrier = comm.barrier();
    barrier->wait();  // blocks the host, as PyTorch's barrier
    CHECK(barrier->is_completed());
    auto work = comm.all_reduce(b);
    work->synchronize();
    CHECK(work->is_completed());
    CHECK(work->is_success());

    CHECK_THROWS_WITH_AS(comm.all_reduce(zeros({2})), doctest::Contains("gloo backend for CPU tensors"), Error);
    CHECK_THROWS_WITH_AS(comm.all_reduce(mask), doctest::Contains("does not reduce bool"), Error);
    CHECK_THROWS_WITH_AS(comm.all_reduce(on_gpu({1}, kInt64, 0), ReduceOp::Avg), doctest::Contains("truncate"), Error);
    CHECK(comm.failure().empty());
  }));
}

TEST_CASE("a rank that never joins: construction times out instead of hanging" * doctest::skip(kGpus < 1)) {
  auto store = std::make_shared<TCPStore>("127.0.0.1", 0, /*is_server=*/true, 20s);
  NcclOptions options;
  options.timeout = 1500ms;
  auto start = Clock::now();
  // Rank 0 alone: NCCL waits for rank 1 to join.
  CHECK_THROWS_WITH_AS(NcclCommunicator(store, "lonely", 0, 2, 0, options),
                       doctest::Contains("NCCL rendezvous of group 'lonely' failed on rank 0 of 2"), Error);
  CHECK(std::chrono::duration<double>(Clock::now() - start).count() < 10.0);
  // Rank 1 alone: rank 0 never publishes the unique id.
  CHECK_THROWS_WITH_AS(NcclCommunicator(store, "lonely2", 1, 2, 0, options),
                       doctest::Contains("rank 0 did not publish the NCCL unique id"), Error);
}

TEST_CASE("2 ranks: the values of every operation" * doctest::skip(kGpus < 2)) {
  require_no_errors(run_ranks(2, [](NcclCommunicator& comm) {
    const int r = comm.rank();
    for (DType dtype : kReducible) {
      CAPTURE(dtype_name(dtype));
      const bool is_unsigned = dtype == kUInt8;
      const double low = is_unsigned ? 0 : -10.0 * r;  // uint8 cannot hold a negative value
      auto reduce = [&](ReduceOp op) {
        Tensor t = on_gpu({double(r + 1), low, 4}, dtype, r);
        comm.all_reduce(t, op)->wait();
        return host(t);
      };
      CHECK(reduce(ReduceOp::Sum) == std::vector<double>{3, is_unsigned ? 0.0 : -10.0, 8});
      CHECK(reduce(ReduceOp::Max) == std::vector<double>{2, 0, 4});
      CHECK(reduce(ReduceOp::Min) == std::vector<double>{1, is_unsigned ? 0.0 : -10.0, 4});
      if (is_floating(dtype)) CHECK(reduce(ReduceOp::Avg) == std::vector<double>{1.5, -5, 4});
    }
    Tensor b = on_gpu({10.0 * r + 1, 10.0 * r + 2}, kFloat32, r);
    comm.broadcast(b, 1)->wait();
    CHECK(host(b) == std::vector<double>{11, 12});

    Tensor in = on_gpu({double(r), r + 0.5}, kFloat32, r);
    std::vector<Tensor> out;  // separate tensors: fused broadcasts
    comm.all_gather(out, in)->wait();
    REQUIRE(out.size() == 2);
    CHECK(host(out[0]) == std::vector<double>{0, 0.5});
    CHECK(host(out[1]) == std::vector<double>{1, 1.5});
    Tensor flat = on_gpu({0, 0, 0, 0}, kFloat32, r);
    std::vector<Tensor> views = flat.chunk(2);  // one flat buffer: ncclAllGather
    comm.all_gather(views, in)->wait();
    CHECK(host(flat) == std::vector<double>{0, 0.5, 1, 1.5});

    Tensor mine = on_gpu({0, 0}, kFloat32, r);
    comm.reduce_scatter(mine, {on_gpu({1.0 + r, 2}, kFloat32, r), on_gpu({10.0 + r, 20}, kFloat32, r)})->wait();
    CHECK(host(mine) == (r == 0 ? std::vector<double>{3, 4} : std::vector<double>{21, 40}));
    Tensor inputs = on_gpu({1.0 + r, 2, 10.0 + r, 20}, kFloat32, r);
    comm.reduce_scatter(mine, inputs.chunk(2), ReduceOp::Max)->wait();  // flat: no staging copy
    CHECK(host(mine) == (r == 0 ? std::vector<double>{2, 2} : std::vector<double>{11, 20}));

    Tensor message = on_gpu({1, 2, 3}, kInt64, r);
    Tensor reply = on_gpu({0, 0}, kBFloat16, r);
    if (r == 0) {  // 0 sends first, 1 receives first: no rank waits for the other
      comm.send(message, 1)->wait();
      comm.recv(reply, 1, /*tag=*/3)->wait();
      CHECK(host(reply) == std::vector<double>{4, 5});
    } else {
      Tensor got = on_gpu({0, 0, 0}, kInt64, r);
      comm.recv(got, 0)->wait();
      CHECK(host(got) == std::vector<double>{1, 2, 3});
      comm.send(on_gpu({4, 5}, kBFloat16, r), 0, /*tag=*/3)->wait();
    }
    comm.barrier()->wait();
  }));
}

TEST_CASE("2 ranks: the communication stream follows the compute stream, and the compute stream follows wait()" *
          doctest::skip(kGpus < 2)) {
  require_no_errors(run_ranks(2, [](NcclCommunicator& comm) {
    const int r = comm.rank();
    const Device device(DeviceType::CUDA, r);
    // A queue of kernels on the compute stream; t is written by the last of them.
    Tensor big = ones({1 << 24}, TensorOptions().device(device));
    for (int i = 0; i < 40; ++i) big.mul_(1.0);
    Tensor t = big.narrow(0, 0, 1 << 20).clone();
    t.fill_(r + 1);
    auto work = comm.all_reduce(t);
    work->wait();  // returns at once; the compute stream waits for the all-reduce
    Tensor u = t.clone();
    u.mul_(2.0);   // compute kernels that read the result
    const auto values = host(u);
    CHECK(std::all_of(values.begin(), values.end(), [](double v) { return v == 6; }));
    CHECK(work->is_completed());

    // Tensors dropped right after their all_reduce: record_stream keeps their memory
    // from the next same-sized allocations until the communication is done.
    std::vector<Tensor> others;
    std::shared_ptr<Work> last;
    for (int i = 0; i < 20; ++i) {
      last = comm.all_reduce(full({1 << 20}, r + 1, TensorOptions().device(device)));
      others.push_back(full({1 << 20}, 100, TensorOptions().device(device)));
    }
    last->synchronize();
    for (const Tensor& other : others) {
      const auto v = host(other);
      CHECK(std::all_of(v.begin(), v.end(), [](double x) { return x == 100; }));
    }
  }));
}

TEST_CASE("2 ranks: mismatched collectives and messages are errors on both sides; the group goes on" *
          doctest::skip(kGpus < 2)) {
  std::vector<std::string> collective(2), message(2);
  require_no_errors(run_ranks(2, [&](NcclCommunicator& comm) {
    const int r = comm.rank();
    const Device device(DeviceType::CUDA, r);
    try {
      comm.all_reduce(zeros({r == 0 ? 4 : 5}, TensorOptions().device(device)))->wait();
    } catch (const Error& e) {
      collective[r] = e.what();
    }
    if (r == 0) {
      comm.send(zeros({4}, TensorOptions().device(device)), 1)->synchronize();  // drained by rank 1
    } else {
      try {
        comm.recv(zeros({5}, TensorOptions().device(device)), 0)->wait();
      } catch (const Error& e) {
        message[r] = e.what();
      }
    }
    Tensor t = ones({2}, TensorOptions().device(device));
    comm.all_reduce(t)->wait();
    CHECK(host(t) == std::vector<double>{2, 2});
  }, 10s));
  for (int r = 0; r < 2; ++r) {
    CAPTURE(collective[r]);
    CHECK(contains(collective[r], "all_reduce(sum) of float32 [4] on rank 0"));
    CHECK(contains(collective[r], "all_reduce(sum) of float32 [5] on rank 1"));
  }
  CHECK(contains(message[1], "recv #0 (from rank 0, tag 0) of float32 [5] on rank 1 of 2"));
  CHECK(contains(message[1], "rank 0 sent float32 [4]"));
}

TEST_CASE("2 ranks: a rank that never arrives, seen through the store: timeout, then the group is unusable" *
          doctest::skip(kGpus < 2)) {
  loom::testing::NeverArrives seen;
  require_no_errors(run_ranks(2, [&](NcclCommunicator& comm) {
    seen.run(comm, 2500ms, TensorOptions().device(Device("cuda:0")));
  }, 1000ms));
  seen.check(1000ms, "rank 1 did not reach this collective", /*at_most_seconds=*/4.0);
}

TEST_CASE("2 ranks: a rank that never arrives, without verification: the watchdog aborts NCCL" *
          doctest::skip(kGpus < 2)) {
  std::string first, later, failure;
  double seconds = 0;
  require_no_errors(run_ranks(2, [&](NcclCommunicator& comm) {
    const Device device(DeviceType::CUDA, comm.rank());
    comm.all_reduce(ones({1}, TensorOptions().device(device)))->synchronize();  // both connected
    if (comm.rank() == 1) {
      std::this_thread::sleep_for(4s);  // never calls the second all_reduce
      return;
    }
    auto start = Clock::now();
    auto work = comm.all_reduce(zeros({3, 2}, TensorOptions().device(device)));
    try {
      work->synchronize();
    } catch (const Error& e) {
      first = e.what();
    }
    seconds = std::chrono::duration<double>(Clock::now() - start).count();
    CHECK(work->is_completed());
    CHECK_FALSE(work->is_success());
    failure = comm.failure();
    try {
      comm.barrier()->wait();
    } catch (const Error& e) {
      later = e.what();
    }
  }, 1500ms, /*verify=*/false));
  CAPTURE(first);
  CHECK(seconds < 5.0);
  CHECK(contains(first, "all_reduce #1 (sum) of float32 [3, 2] on rank 0 of 2"));
  CHECK(contains(first, "timed out after 1500 ms"));
  CHECK_FALSE(failure.empty());
  CHECK(contains(later, "barrier #2 on rank 0 of 2 was not run"));
}
#endif  // LOOM_WITH_NCCL
