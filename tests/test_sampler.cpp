// Samplers: the index maps are pure functions, checked exactly: order, padding,
// disjointness and coverage of DistributedSampler's shares, and its epoch warning.
#include <doctest/doctest.h>

#include <algorithm>
#include <iostream>
#include <limits>
#include <map>
#include <sstream>

#include "core/error.h"
#include "data/distributed_sampler.h"
#include "data/sampler.h"

using namespace loom;
using namespace loom::data;
using Indices = std::vector<int64_t>;

namespace {

bool is_permutation_of_range(Indices v, int64_t n) {
  std::sort(v.begin(), v.end());
  return v == sequential_indices(n);
}

// Captures std::cerr for the lifetime of the object.
struct CaptureStderr {
  std::ostringstream text;
  std::streambuf* old = std::cerr.rdbuf(text.rdbuf());
  ~CaptureStderr() { std::cerr.rdbuf(old); }
};

}  // namespace

TEST_CASE("sequential and random orders") {
  CHECK(sequential_indices(4) == Indices{0, 1, 2, 3});
  CHECK(sequential_indices(0).empty());
  Indices a = random_permutation(100, 7);
  CHECK(is_permutation_of_range(a, 100));
  CHECK(a == random_permutation(100, 7));  // pure function of (n, seed)
  CHECK(a != random_permutation(100, 8));
  CHECK(a != sequential_indices(100));
  CHECK(random_permutation(0, 1).empty());
  CHECK(random_permutation(1, 1) == Indices{0});
}

TEST_CASE("len(loader) arithmetic: ceil, or floor with drop_last") {
  CHECK(num_batches(10, 3, false) == 4);
  CHECK(num_batches(10, 3, true) == 3);
  CHECK(num_batches(9, 3, false) == 3);
  CHECK(num_batches(9, 3, true) == 3);
  CHECK(num_batches(2, 3, false) == 1);
  CHECK(num_batches(2, 3, true) == 0);
  CHECK(num_batches(0, 3, false) == 0);
  CHECK(num_batches(50000, 128, false) == 391);
  CHECK(num_batches(50000, 128, true) == 390);
  CHECK_THROWS_AS(num_batches(10, 0, false), Error);
}

TEST_CASE("RandomSampler: a new permutation per pass, replayable with set_epoch") {
  RandomSampler sampler(50, /*seed=*/3);
  CHECK(sampler.size() == 50);
  Indices e0 = sampler.next_pass(), e1 = sampler.next_pass(), e2 = sampler.next_pass();
  CHECK(is_permutation_of_range(e0, 50));
  CHECK(is_permutation_of_range(e1, 50));
  CHECK(e0 != e1);
  CHECK(e1 != e2);
  CHECK(e0 == random_permutation(50, 3));
  CHECK(e2 == random_permutation(50, 5));
  sampler.set_epoch(1);
  CHECK(sampler.next_pass() == e1);
  CHECK(sampler.next_pass() == e2);
  SequentialSampler sequential(3);
  CHECK(sequential.next_pass() == Indices{0, 1, 2});
  CHECK(sequential.next_pass() == Indices{0, 1, 2});
}

TEST_CASE("DistributedSampler without shuffle: PyTorch's exact assignment") {
  // N=10, R=3: total_size 12, padded with indices 0, 1 from the start.
  CHECK(distributed_indices(10, 3, 0, false, 0, 0, false) == Indices{0, 3, 6, 9});
  CHECK(distributed_indices(10, 3, 1, false, 0, 0, false) == Indices{1, 4, 7, 0});
  CHECK(distributed_indices(10, 3, 2, false, 0, 0, false) == Indices{2, 5, 8, 1});
  // drop_last: total_size 9, index 9 is dropped.
  CHECK(distributed_indices(10, 3, 0, false, 0, 0, true) == Indices{0, 3, 6});
  CHECK(distributed_indices(10, 3, 1, false, 0, 0, true) == Indices{1, 4, 7});
  CHECK(distributed_indices(10, 3, 2, false, 0, 0, true) == Indices{2, 5, 8});
  // Fewer samples than replicas: padding repeats the order cyclically.
  CHECK(distributed_indices(2, 5, 0, false, 0, 0, false) == Indices{0});
  CHECK(distributed_indices(2, 5, 1, false, 0, 0, false) == Indices{1});
  CHECK(distributed_indices(2, 5, 2, false, 0, 0, false) == Indices{0});
  CHECK(distributed_indices(2, 5, 3, false, 0, 0, false) == Indices{1});
  CHECK(distributed_indices(2, 5, 4, false, 0, 0, false) == Indices{0});
  CHECK(distributed_indices(2, 5, 4, false, 0, 0, true).empty());
  // Even split: no padding, no drop.
  CHECK(distributed_indices(8, 4, 3, false, 0, 0, false) == Indices{3, 7});
  CHECK(distributed_indices(8, 4, 3, false, 0, 0, true) == Indices{3, 7});
  CHECK(distributed_indices(0, 2, 1, true, 0, 0, false).empty());
  CHECK(distributed_num_samples(10, 3, false) == 4);
  CHECK(distributed_num_samples(10, 3, true) == 3);
  CHECK(distributed_num_samples(50000, 8, false) == 6250);
  CHECK(distributed_num_samples(50000, 3, false) == 16667);
  CHECK(distributed_num_samples(50000, 3, true) == 16666);
}

TEST_CASE("DistributedSampler with shuffle: disjoint shares, full coverage, exact padding") {
  struct Case { int64_t n, replicas; bool drop_last; };
  for (Case c : {Case{10, 3, false}, Case{10, 3, true}, Case{100, 8, false}, Case{100, 8, true}, Case{3, 5, false},
                 Case{64, 4, false}, Case{1000, 7, false}, Case{1000, 7, true}}) {
    CAPTURE(c.n);
    CAPTURE(c.replicas);
    CAPTURE(c.drop_last);
    for (int64_t epoch : {0, 1}) {
      const uint64_t seed = 42;
      const int64_t per_rank = distributed_num_samples(c.n, c.replicas, c.drop_last);
      const int64_t total = per_rank * c.replicas;
      std::vector<Indices> shares;
      for (int64_t r = 0; r < c.replicas; ++r) {
        shares.push_back(distributed_indices(c.n, c.replicas, r, true, seed, epoch, c.drop_last));
        CHECK(static_cast<int64_t>(shares.back().size()) == per_rank);
      }
      // Interleaving the shares back (slot i belongs to rank i % R) must give the
      // permutation for seed + epoch, padded from its start or cut to total_size.
      Indices order = random_permutation(c.n, seed + static_cast<uint64_t>(epoch));
      Indices expected;
      for (int64_t i = 0; i < total; ++i) expected.push_back(order[static_cast<size_t>(i % c.n)]);
      Indices interleaved(static_cast<size_t>(total));
      for (int64_t i = 0; i < total; ++i)
        interleaved[static_cast<size_t>(i)] = shares[static_cast<size_t>(i % c.replicas)][static_cast<size_t>(i / c.replicas)];
      CHECK(interleaved == expected);
      // Coverage and multiplicity: every index once; without drop_last the padding
      // repeats exactly total - n of them; with drop_last exactly n - total are missing.
      std::map<int64_t, int64_t> seen;
      for (const auto& share : shares)
        for (int64_t i : share) ++seen[i];
      int64_t repeated = 0;
      for (auto [index, times] : seen) {
        CHECK(index >= 0);
        CHECK(index < c.n);
        repeated += times - 1;
      }
      if (c.drop_last) {
        CHECK(repeated == 0);  // disjoint
        CHECK(static_cast<int64_t>(seen.size()) == total);
      } else {
        CHECK(static_cast<int64_t>(seen.size()) == c.n);  // full coverage
        CHECK(repeated == total - c.n);
      }
    }
  }
  // The order changes with the epoch and the seed, identically on every rank.
  CHECK(distributed_indices(100, 4, 0, true, 0, 0, false) != distributed_indices(100, 4, 0, true, 0, 1, false));
  CHECK(distributed_indices(100, 4, 0, true, 0, 0, false) != distributed_indices(100, 4, 0, true, 1, 0, false));
}

TEST_CASE("DistributedSampler validates rank and replicas with a clear error") {
  try {
    DistributedSampler sampler(100, 4, 4);
    FAIL("expected an error");
  } catch (const Error& e) {
    std::string message = e.what();
    CHECK(message.find("invalid rank 4") != std::string::npos);
    CHECK(message.find("[0, 3]") != std::string::npos);
  }
  CHECK_THROWS_AS(DistributedSampler(100, 4, -1), Error);
  CHECK_THROWS_AS(DistributedSampler(100, 0, 0), Error);
  CHECK_THROWS_AS(distributed_indices(100, 2, 2, false, 0, 0, false), Error);
}

TEST_CASE("DistributedSampler follows set_epoch and warns once when it is forgotten") {
  DistributedSampler sampler(20, 2, 1, /*shuffle=*/true, /*seed=*/5);
  CHECK(sampler.size() == 10);
  CHECK(sampler.total_size() == 20);
  {
    CaptureStderr err;
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
      sampler.set_epoch(epoch);
      CHECK(sampler.next_pass() == distributed_indices(20, 2, 1, true, 5, epoch, false));
    }
    CHECK(err.text.str().empty());
  }
  {
    CaptureStderr err;
    Indices again = sampler.next_pass();  // no set_epoch: repeats epoch 2
    CHECK(again == distributed_indices(20, 2, 1, true, 5, 2, false));
    (void)sampler.next_pass();
    const std::string text = err.text.str();
    CHECK(text.find("set_epoch") != std::string::npos);
    CHECK(text.find("set_epoch", text.find("set_epoch") + 1) != std::string::npos);  // names both calls
    CHECK(std::count(text.begin(), text.end(), '\n') == 1);  // once
  }
  {
    CaptureStderr err;  // without shuffle the order is meant to repeat: no warning
    DistributedSampler fixed(20, 2, 0, /*shuffle=*/false);
    CHECK(fixed.next_pass() == fixed.next_pass());
    CHECK(err.text.str().empty());
  }
}

TEST_CASE("batch and shard counts do not overflow for huge batch sizes") {
  const int64_t huge = std::numeric_limits<int64_t>::max();
  CHECK(num_batches(10, huge, false) == 1);
  CHECK(num_batches(10, huge - 5, false) == 1);
  CHECK(num_batches(10, huge, true) == 0);
  CHECK(num_batches(0, 4, false) == 0);
  CHECK(num_batches(9, 4, false) == 3);
  CHECK(distributed_num_samples(huge, 2, false) == huge / 2 + 1);
  CHECK(distributed_num_samples(0, 3, false) == 0);
  CHECK(distributed_num_samples(7, 3, false) == 3);
}
