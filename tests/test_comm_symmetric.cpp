// Symmetric memory (Note [Symmetric memory], parallel/comm/communicator.h): tensors every
// rank allocates together in the gloo backend's shared-memory segment, and the
// all_reduce that reduces them in place without staging copies. Checked against values
// computed here on 2 and 3 ranks, for whole tensors and same-offset slices; back-to-back
// reductions of one tensor rewritten between them (no rank returns before every chunk is
// done); a late rank that leaves the chunks to the others (Note [Whoever waits reduces]); ranks
// whose tensors are not at the same place (a clear error, nothing moved); the TCP
// fallback (plain zeros); the memory outliving the communicator; and DDP's buckets
// living there.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <thread>

#include "core/factory.h"
#include "core/memory.h"  // defines: memory_allocated, set_device_memory_limit, OutOfMemoryError
#include "nn/nn.h"
#include "parallel/ddp/distributed_data_parallel.h"
#include "rank_threads.h"   // defines: run_ranks, require_no_errors, contains
#include "collective_checks.h"  // defines: value, expected, values_of, loom_segments_in_dev_shm

using namespace loom;
using namespace loom::distributed;
using namespace loom::testing;

namespace {

using Clock = std::chrono::steady_clock;

GlooCommunicator& as_gloo(const std::shared_ptr<Communicator>& comm) { return dynamic_cast<GlooCommunicator&>(*comm); }

// The first element of `t` that differs from expected(op, world, i + salt), or "".
std::string first_mismatch(const Tensor& t, distributed::ReduceOp op, int world, int64_t salt = 0) {
  auto got = t.to(kFloat64).tolist<double>();
  for (int64_t i = 0; i < static_cast<int64_t>(got.size()); ++i) {
    const double want = expected(op, world, i + salt);
    if (std::abs(got[size_t(i)] - want) > 1e-6 * (1 + std::abs(want)))
      return detail::str(reduce_op_name(op), " [", i, "]: got ", got[size_t(i)], ", expected ", want);
  }
  return "";
}


}  // namespace

TEST_CASE("zeros_symmetric: zero-filled, in the segment; all_reduce of it and of same-offset slices is exact") {
  for (int n : {2, 3}) {
    CAPTURE(n);
    std::vector<std::string> problems(n);
    require_no_errors(run_ranks(n, [&](std::shared_ptr<Communicator> comm) {
      const int r = comm->rank();
      std::string& problem = problems[r];
      for (DType dtype : {kFloat32, kFloat64, kInt32, kInt64}) {
        for (int64_t size : {int64_t(1), int64_t(17), int64_t(100003)}) {
          Tensor t = comm->zeros_symmetric({size}, TensorOptions(dtype));
          if (!as_gloo(comm).why_not_symmetric().empty()) problem = "not symmetric: " + as_gloo(comm).why_not_symmetric();
          if (t.to(kFloat64).abs().sum().item<double>() != 0) problem = "not zero-filled";
          for (distributed::ReduceOp op : {distributed::ReduceOp::Sum, distributed::ReduceOp::Avg, distributed::ReduceOp::Max, distributed::ReduceOp::Min}) {
            if (op == distributed::ReduceOp::Avg && !is_floating(dtype)) continue;
            t.copy_(values_of(r, size, dtype));
            comm->all_reduce(t, op)->wait();
            if (std::string m = first_mismatch(t, op, n); !m.empty() && problem.empty())
              problem = detail::str(dtype_name(dtype), " size ", size, " ", m);
          }
        }
      }
      // A slice at the same offset on every rank (a DDP bucket inside one allocation).
      Tensor whole = comm->zeros_symmetric({1000}, TensorOptions(kFloat32));
      Tensor slice = whole.narrow(0, 333, 401);
      slice.copy_(values_of(r, 401, kFloat32, /*salt=*/333));
      whole.narrow(0, 0, 333).fill_(-1.0);
      comm->all_reduce(slice)->wait();
      if (std::string m = first_mismatch(slice, distributed::ReduceOp::Sum, n, 333); !m.empty()) problem = "slice: " + m;
      if (whole.narrow(0, 0, 333).max().item<float>() != -1.0f) problem = "the slice's all_reduce wrote outside it";
    }));
    for (int r = 0; r < n; ++r) CHECK_MESSAGE(problems[r].empty(), "rank ", r, ": ", problems[r]);
  }
}

TEST_CASE("symmetric all_reduce: bitwise identical on every rank, and the same bits as the staged algorithm") {
  std::vector<Tensor> inputs;  // on this thread: the default generator is not shared safely
  for (int r = 0; r < 3; ++r) inputs.push_back(randn({50001}).mul_(1.0 + r));
  std::vector<std::vector<float>> symmetric(3), staged(3);
  require_no_errors(run_ranks(3, [&](std::shared_ptr<Communicator> comm) {
    const int r = comm->rank();
    Tensor s = comm->zeros_symmetric({50001}, TensorOptions(kFloat32));
    s.copy_(inputs[r]);
    comm->all_reduce(s, distributed::ReduceOp::Avg)->wait();
    symmetric[r] = s.tolist<float>();
    Tensor plain = inputs[r].clone();
    comm->all_reduce(plain, distributed::ReduceOp::Avg)->wait();
    staged[r] = plain.tolist<float>();
  }));
  CHECK(symmetric[0] == symmetric[1]);
  CHECK(symmetric[0] == symmetric[2]);
  CHECK(symmetric[0] == staged[0]);  // every element summed in rank order by both
}

TEST_CASE("back-to-back symmetric all_reduces of one tensor rewritten in between: no rank reads the next values") {
  // A rank that returned before its peers finished reading its block would let them read
  // the next iteration's values (Note [Symmetric memory]; all_reduce_symmetric waits for
  // every chunk). Rank 1 sleeps now and then, so that rank 0 races ahead whenever it can.
  std::vector<std::string> problems(2);
  require_no_errors(run_ranks(2, [&](std::shared_ptr<Communicator> comm) {
    const int r = comm->rank();
    Tensor t = comm->zeros_symmetric({20000}, TensorOptions(kFloat64));
    for (int step = 0; step < 200 && problems[r].empty(); ++step) {
      t.fill_(double(step * 10 + r));
      if (r == 1 && step % 20 == 0) std::this_thread::sleep_for(2ms);
      comm->all_reduce(t)->wait();
      const double want = double(step * 20 + 1);
      if (t.min().item<double>() != want || t.max().item<double>() != want)
        problems[r] = detail::str("step ", step, ": got [", t.min().item<double>(), ", ", t.max().item<double>(),
                                  "], expected ", want);
    }
  }));
  CHECK_MESSAGE(problems[0].empty(), problems[0]);
  CHECK_MESSAGE(problems[1].empty(), problems[1]);
}

TEST_CASE("symmetric all_gather: every rank's piece in rank order, the same as staged; pieces rewritten at once") {
  // Note [Symmetric all_gather]: each rank copies every piece straight from its owner's
  // block, then waits until nobody reads its own. Rank 1 sleeps now and then so that the
  // others race ahead and rewrite their pieces whenever the protocol lets them; 3 ranks,
  // and an odd size, so that the pieces' ends are not aligned.
  const int world = 3;
  const int64_t n = 10001;
  std::vector<std::string> problems(world);
  require_no_errors(run_ranks(world, [&](std::shared_ptr<Communicator> comm) {
    const int r = comm->rank();
    Tensor piece = comm->zeros_symmetric({n}, TensorOptions(kFloat64));
    if (!as_gloo(comm).why_not_symmetric().empty()) problems[r] = "not symmetric: " + as_gloo(comm).why_not_symmetric();
    Tensor gathered = zeros({world * n}, kFloat64), staged = zeros({world * n}, kFloat64);
    std::vector<Tensor> out = gathered.chunk(world), staged_out = staged.chunk(world);
    for (int step = 0; step < 150 && problems[r].empty(); ++step) {
      std::vector<double> values(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) values[size_t(i)] = double(step * 1000000 + r * n + i);
      piece.copy_(from_vector(values, {n}));
      if (r == 1 && step % 15 == 0) std::this_thread::sleep_for(2ms);
      comm->all_gather(out, piece)->wait();
      const std::vector<double> got = gathered.tolist<double>();
      for (int64_t i = 0; i < world * n && problems[r].empty(); ++i)
        if (got[size_t(i)] != double(step * 1000000 + i))
          problems[r] = detail::str("step ", step, ": element ", i, " is ", got[size_t(i)], ", expected ",
                                    step * 1000000 + i);
      if (step % 50 == 0) {  // the staged algorithm agrees
        comm->all_gather(staged_out, piece.clone())->wait();
        if (problems[r].empty() && staged.tolist<double>() != got) problems[r] = detail::str("step ", step, ": staged differs");
      }
    }
  }));
  for (int r = 0; r < world; ++r) CHECK_MESSAGE(problems[r].empty(), problems[r]);
}

TEST_CASE("all_gather_one_sided: a rank copies every piece while its peers do something else; ordinary memory is refused") {
  // Note [One-sided all_gather]: rank 1 copies while rank 0 is blocked on a flag that only
  // rank 1's finished copy sets; a collective all_gather would wait for rank 0 forever.
  std::vector<std::vector<double>> got(2);
  std::vector<std::string> refused(2);
  std::atomic<bool> rank1_copied{false};
  require_no_errors(run_ranks(2, [&](std::shared_ptr<Communicator> comm) {
    const int r = comm->rank();
    Tensor piece = comm->zeros_symmetric({5}, TensorOptions(kFloat64));
    REQUIRE(comm->is_symmetric(piece));
    piece.fill_(double(r + 1));
    comm->barrier()->wait();  // both pieces final
    std::vector<Tensor> out;
    if (r == 0) {
      while (!rank1_copied.load()) std::this_thread::yield();
    }
    comm->all_gather_one_sided(out, piece);
    if (r == 1) rank1_copied.store(true);
    for (const Tensor& t : out)
      for (double v : t.tolist<double>()) got[r].push_back(v);
    try {
      std::vector<Tensor> out2;
      comm->all_gather_one_sided(out2, zeros({5}, kFloat64));
    } catch (const Error& e) {
      refused[r] = e.what();
    }
    comm->barrier()->wait();  // nobody rewrites a piece a peer may still read
  }));
  for (int r = 0; r < 2; ++r) {
    CHECK(got[r] == std::vector<double>{1, 1, 1, 1, 1, 2, 2, 2, 2, 2});
    CHECK(contains(refused[r], "the input must lie in symmetric memory"));
  }
}

TEST_CASE("whoever waits reduces: a rank busy elsewhere leaves every chunk to the others, unless its caller waits") {
  // Note [Whoever waits reduces] (shm_collectives.h). 4 MiB of float32: 64 chunks.
  for (bool late_rank_waits_at_once : {false, true}) {
    CAPTURE(late_rank_waits_at_once);
    std::vector<int64_t> chunks(2);
    std::vector<std::string> problems(2);
    bool done_before_late_rank_waited = false;
    std::atomic<bool> rank0_launched{false};
    require_no_errors(run_ranks(2, [&](std::shared_ptr<Communicator> comm) {
      const int r = comm->rank();
      Tensor t = comm->zeros_symmetric({int64_t(1) << 20}, TensorOptions(kFloat32));
      t.fill_(float(r + 1));
      comm->barrier()->wait();
      if (r == 1) {  // rank 1 arrives last: well after rank 0 has launched its all_reduce
        while (!rank0_launched.load()) std::this_thread::sleep_for(1ms);
        std::this_thread::sleep_for(200ms);
      }
      auto work = comm->all_reduce(t);
      if (r == 0) rank0_launched.store(true);
      if (r == 1 && !late_rank_waits_at_once) {
        // "Busy": rank 0, which waits, must finish the whole reduction meanwhile.
        const auto give_up = Clock::now() + 10s;
        while (!work->is_completed() && Clock::now() < give_up) std::this_thread::sleep_for(1ms);
        done_before_late_rank_waited = work->is_completed();
      }
      work->wait();
      if (t.min().item<float>() != 3.0f || t.max().item<float>() != 3.0f)
        problems[r] = detail::str("got [", t.min().item<float>(), ", ", t.max().item<float>(), "], expected 3");
      chunks[r] = as_gloo(comm).symmetric_chunks_reduced();
    }));
    CHECK_MESSAGE(problems[0].empty(), problems[0]);
    CHECK_MESSAGE(problems[1].empty(), problems[1]);
    CHECK(chunks[0] + chunks[1] == 64);
    if (!late_rank_waits_at_once) {
      CHECK(done_before_late_rank_waited);
      CHECK(chunks[0] == 64);
      CHECK(chunks[1] == 0);
    }
  }
}

TEST_CASE("ranks whose tensors are not at the same place get one clear error; nothing moved, the group goes on") {
  std::vector<std::string> messages(4), gather_messages(2);
  std::vector<float> after(2);
  require_no_errors(run_ranks(2, [&](std::shared_ptr<Communicator> comm) {
    const int r = comm->rank();
    Tensor s = comm->zeros_symmetric({8}, TensorOptions(kFloat32));
    // Rank 0 in symmetric memory, rank 1 in ordinary memory.
    try {
      comm->all_reduce(r == 0 ? s.narrow(0, 0, 4) : zeros({4}))->wait();
    } catch (const Error& e) {
      messages[r] = e.what();
    }
    // Both symmetric, at different offsets.
    try {
      comm->all_reduce(s.narrow(0, r * 4, 4))->wait();
    } catch (const Error& e) {
      messages[2 + r] = e.what();
    }
    // all_gather decides the same way: one rank's input symmetric, the other's not.
    std::vector<Tensor> out = {zeros({4}), zeros({4})};
    try {
      comm->all_gather(out, r == 0 ? s.narrow(0, 0, 4) : zeros({4}))->wait();
    } catch (const Error& e) {
      gather_messages[r] = e.what();
    }
    s.fill_(1.0);
    comm->all_reduce(s)->wait();
    after[r] = s.tolist<float>()[7];
  }));
  for (int r = 0; r < 2; ++r) {
    CAPTURE(messages[r]);
    CHECK(contains(messages[r], "not at the same place in symmetric memory"));
    CHECK(contains(messages[r], "rank 0: symmetric allocation #0 at byte 0"));
    CHECK(contains(messages[r], "rank 1: ordinary memory"));
    CAPTURE(messages[2 + r]);
    CHECK(contains(messages[2 + r], "rank 0: symmetric allocation #0 at byte 0"));
    CHECK(contains(messages[2 + r], "rank 1: symmetric allocation #0 at byte 16"));
    CAPTURE(gather_messages[r]);
    CHECK(contains(gather_messages[r], "all_gather"));
    CHECK(contains(gather_messages[r], "rank 1: ordinary memory"));
  }
  CHECK(after == std::vector<float>{2, 2});
}

TEST_CASE("over TCP zeros_symmetric is plain zeros, says why, and all_reduce works as usual") {
  std::vector<std::string> why_tcp(2);
  std::vector<float> sums(2);
  require_no_errors(run_ranks(
      2,
      [&](std::shared_ptr<Communicator> comm) {
        const int r = comm->rank();
        Tensor t = comm->zeros_symmetric({5}, TensorOptions(kFloat32));
        why_tcp[r] = as_gloo(comm).why_not_symmetric();
        t.fill_(r + 1.0);
        comm->all_reduce(t)->wait();
        sums[r] = t.tolist<float>()[4];
      },
      20s, /*shared_memory=*/false));
  for (int r = 0; r < 2; ++r) CHECK(contains(why_tcp[r], "collectives go over TCP"));
  CHECK(sums == std::vector<float>{3, 3});
}

TEST_CASE("a symmetric tensor outlives its communicator, and nothing is left in /dev/shm") {
  const size_t before = loom_segments_in_dev_shm();
  std::vector<Tensor> kept(2);
  require_no_errors(run_ranks(2, [&](std::shared_ptr<Communicator> comm) {
    Tensor t = comm->zeros_symmetric({1000}, TensorOptions(kFloat32));
    t.fill_(comm->rank() + 1.0);
    comm->all_reduce(t)->wait();
    kept[comm->rank()] = t;
  }));  // the communicators are gone here
  CHECK(kept[0].sum().item<float>() == 3000.0f);
  CHECK(kept[1].sum().item<float>() == 3000.0f);
  CHECK(loom_segments_in_dev_shm() == before);
}

// Address ranges of this process's mappings of symmetric segments (their names end in
// "_sym": unique_segment_name(prefix + "-sym"); unlinked, so /proc shows "(deleted)").
static std::vector<std::pair<uintptr_t, uintptr_t>> symmetric_mappings() {
  std::vector<std::pair<uintptr_t, uintptr_t>> out;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("/dev/shm/loom-") == std::string::npos || line.find("_sym") == std::string::npos) continue;
    const size_t dash = line.find('-');
    out.emplace_back(std::stoull(line.substr(0, dash), nullptr, 16),
                     std::stoull(line.substr(dash + 1, line.find(' ') - dash - 1), nullptr, 16));
  }
  return out;
}

TEST_CASE("DDP's buckets are symmetric memory: with gradient_as_bucket_view every .grad() lies in a segment") {
  auto start = std::make_shared<nn::Linear>(64, 32);
  std::vector<std::shared_ptr<nn::Module>> models = {start->clone(), start->clone()};
  const Tensor x = randn({8, 64});
  std::vector<int> outside(2, -1);
  require_no_errors(run_ranks(2, [&](std::shared_ptr<Communicator> comm) {
    const int r = comm->rank();
    ddp::DistributedDataParallel ddp(models[r], comm, {.gradient_as_bucket_view = true});
    ddp(x.narrow(0, r * 4, 4)).sum().backward();
    const auto ranges = symmetric_mappings();
    int count = 0;
    for (const Tensor& p : models[r]->parameters()) {
      const auto at = reinterpret_cast<uintptr_t>(p.grad().raw_data());
      bool inside = false;
      for (const auto& [lo, hi] : ranges) inside = inside || (at >= lo && at < hi);
      count += !inside;
    }
    outside[r] = count;
  }));
  CHECK(outside == std::vector<int>{0, 0});
}

TEST_CASE("a rank's symmetric block counts on its device as allocator memory, against its budget, until freed") {
  std::vector<std::string> problems(2);
  require_no_errors(run_ranks(2, [&](std::shared_ptr<Communicator> comm) {
    const Device device("cpu:" + std::to_string(5 + comm->rank()));  // a device of its own: counts apart
    std::string& problem = problems[static_cast<size_t>(comm->rank())];
    const int64_t before = memory_allocated(device);
    {
      Tensor t = comm->zeros_symmetric({1 << 20}, TensorOptions(kFloat32).device(device));  // 4 MiB, whole pages
      if (memory_allocated(device) - before != 4 << 20) problem = detail::str("allocated grew by ", memory_allocated(device) - before);
    }
    if (memory_allocated(device) != before) problem = "not given back when the tensor died";
    set_device_memory_limit(memory_reserved(device) + (1 << 20), device);
    try {
      (void)comm->zeros_symmetric({1 << 20}, TensorOptions(kFloat32).device(device));
      problem = "no OutOfMemoryError past the budget";
    } catch (const OutOfMemoryError&) {
    }
    set_device_memory_limit(kNoMemoryLimit, device);
  }));
  for (const std::string& p : problems) CHECK(p == "");
}
