// DTensor (parallel/tensor/): placements, distribute_tensor / full_tensor round trips with
// uneven shards, the value of every redistribute move, and every move's gradient against one
// single-process autograd graph of the same loss, on 2 and 3 thread ranks.
//
// Every value is a small integer in float64, so sums in any order are exact and the
// distributed gradients must equal the reference bit for bit.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "autograd/ops.h"                 // defines: sum, matmul, the elementwise ops
#include "core/factory.h"                 // defines: from_vector
#include "parallel/tensor/dtensor.h"      // defines: DTensor, distribute_tensor, redistribute
#include "parallel/tensor/redistribute.h" // defines: redistribute_local
#include "rank_threads.h"                 // defines: run_ranks, require_no_errors

using namespace loom;
using namespace loom::distributed;
using loom::testing::require_no_errors;
using loom::testing::run_ranks;

namespace {

// A float64 tensor of small integers in [-5, 5], different for each seed.
Tensor integers(const Shape& shape, int seed) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<double> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[static_cast<size_t>(i)] = static_cast<double>((i * 7 + seed * 5 + 3) % 11) - 5;
  return from_vector<double>(values, shape);
}

// Rank r's chunk of `t` along `dim`, computed here from shard_range (the reference cut).
Tensor chunk_of(const Tensor& t, int64_t dim, int world, int rank) {
  const ShardRange range = shard_range(t.size(dim), world, rank);
  return t.narrow(dim, range.offset, range.length).clone();
}

// Largest |a - b|; infinity when the shapes differ (so a wrong shape fails the CHECK).
double diff(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined() || a.shape() != b.shape()) return std::numeric_limits<double>::infinity();
  double m = 0;
  auto x = a.tolist<double>(), y = b.tolist<double>();
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

// The gradient of sum(x * weights) with respect to x, by single-process autograd.
Tensor reference_grad(const Tensor& x, const Tensor& weights) {
  Tensor leaf = x.detach().clone().requires_grad_(true);
  sum(leaf * weights).backward();
  return leaf.grad();
}

struct Case {
  int world;
  Shape shape;
};
// 5 rows over 2 ranks (3, 2), over 3 ranks (2, 2, 1), and 2 rows over 3 ranks (1, 1, 0).
const std::vector<Case> kCases = {{2, {5, 3}}, {3, {5, 3}}, {3, {2, 3}}};

}  // namespace

TEST_CASE("placements: names as PyTorch, and torch.chunk's uneven shards") {
  CHECK(Shard(1).str() == "Shard(dim=1)");
  CHECK(Replicate().str() == "Replicate()");
  CHECK(Partial().str() == "Partial(sum)");
  CHECK(Shard(0) == Shard(0));
  CHECK_FALSE(Shard(0) == Shard(1));
  CHECK_FALSE(Replicate() == Partial());
  CHECK(normalized(Shard(-1), 3) == Shard(2));
  CHECK_THROWS_WITH_AS(normalized(Shard(2), 2), doctest::Contains("Shard(dim=2) does not fit a tensor of 2 dimensions"),
                       Error);

  std::vector<int64_t> lengths;
  for (int r = 0; r < 2; ++r) lengths.push_back(shard_range(5, 2, r).length);
  CHECK(lengths == std::vector<int64_t>{3, 2});
  lengths.clear();
  for (int r = 0; r < 3; ++r) lengths.push_back(shard_range(5, 3, r).length);
  CHECK(lengths == std::vector<int64_t>{2, 2, 1});
  lengths.clear();
  for (int r = 0; r < 3; ++r) lengths.push_back(shard_range(2, 3, r).length);
  CHECK(lengths == std::vector<int64_t>{1, 1, 0});
  CHECK(shard_range(2, 3, 2).offset == 2);
  CHECK(shard_range(4, 3, 2).length == 0);  // torch.chunk(4 rows, 3) gives 2 pieces of 2
  CHECK(local_shape({5, 3}, Shard(1), 2, 1) == Shape{5, 1});
  CHECK(local_shape({5, 3}, Partial(), 2, 1) == Shape{5, 3});
}

TEST_CASE("distribute_tensor and full_tensor round trips, uneven shards and a rank with no rows") {
  for (const Case& c : kCases) {
    for (int64_t dim : {0, 1}) {
      CAPTURE(c.world);
      CAPTURE(dim);
      const Tensor full = integers(c.shape, 1);
      std::vector<Tensor> locals(static_cast<size_t>(c.world)), gathered(locals.size()), replicated(locals.size());
      require_no_errors(run_ranks(c.world, [&](std::shared_ptr<Communicator> group) {
        const auto r = static_cast<size_t>(group->rank());
        DTensor d = distribute_tensor(full, group, Shard(dim));
        LOOM_CHECK(d.shape() == full.shape() && d.placement() == Shard(dim), "wrong global shape or placement");
        locals[r] = d.to_local();
        gathered[r] = d.full_tensor();
        replicated[r] = distribute_tensor(full, group, Replicate()).full_tensor();
      }));
      for (int r = 0; r < c.world; ++r) {
        CAPTURE(r);
        const auto i = static_cast<size_t>(r);
        CHECK(diff(locals[i], chunk_of(full, dim, c.world, r)) == 0);
        CHECK(diff(gathered[i], full) == 0);
        CHECK(diff(replicated[i], full) == 0);
      }
      if (c.shape[0] == 2 && dim == 0) CHECK(locals[2].shape() == Shape{0, 3});
    }
  }
}

TEST_CASE("redistribute: the value of every move") {
  for (const Case& c : kCases) {
    CAPTURE(c.world);
    const Tensor full = integers(c.shape, 2);
    std::vector<Tensor> summands;  // rank r's Partial() summand
    Tensor total = zeros(c.shape, TensorOptions(kFloat64));
    for (int r = 0; r < c.world; ++r) {
      summands.push_back(integers(c.shape, 10 + r));
      total = total + summands.back();
    }
    const auto n = static_cast<size_t>(c.world);
    std::vector<Tensor> shard_to_rep(n), partial_to_rep(n), partial_to_shard(n), rep_to_shard(n);
    require_no_errors(run_ranks(c.world, [&](std::shared_ptr<Communicator> group) {
      const int rank = group->rank();
      const auto r = static_cast<size_t>(rank);
      DTensor sharded = DTensor::from_local(chunk_of(full, 0, c.world, rank), group, Shard(0), full.shape());
      shard_to_rep[r] = redistribute(sharded, Replicate()).to_local();
      DTensor partial = DTensor::from_local(summands[r], group, Partial());
      partial_to_rep[r] = partial.redistribute(Replicate()).to_local();
      DTensor partial_sharded = partial.redistribute(Shard(0));
      LOOM_CHECK(partial_sharded.placement() == Shard(0), "Partial -> Shard gave ", partial_sharded.placement().str());
      partial_to_shard[r] = partial_sharded.to_local();
      rep_to_shard[r] = DTensor::from_local(full, group, Replicate()).redistribute(Shard(0)).to_local();
    }));
    for (int r = 0; r < c.world; ++r) {
      CAPTURE(r);
      const auto i = static_cast<size_t>(r);
      CHECK(diff(shard_to_rep[i], full) == 0);
      CHECK(diff(partial_to_rep[i], total) == 0);
      CHECK(diff(partial_to_shard[i], chunk_of(total, 0, c.world, r)) == 0);
      CHECK(diff(rep_to_shard[i], chunk_of(full, 0, c.world, r)) == 0);
    }
  }
}

TEST_CASE("redistribute: every move's gradient equals single-process autograd") {
  // Each rank's loss is sum(its output * its part of W). A Replicate() output is the whole
  // tensor on every rank, and every rank computes the same loss from it: that one loss is the
  // single-process loss (Note [Gradient placements]). A Shard() output's losses, one per
  // rank, add up to the single-process loss.
  for (const Case& c : kCases) {
    CAPTURE(c.world);
    const Tensor full = integers(c.shape, 3), W = integers(c.shape, 4);
    const Tensor grad = reference_grad(full, W);  // d sum(x * W) / dx: also each summand's
    const auto n = static_cast<size_t>(c.world);
    std::vector<Tensor> shard_to_rep(n), partial_to_rep(n), partial_to_shard(n), rep_to_shard(n);
    require_no_errors(run_ranks(c.world, [&](std::shared_ptr<Communicator> group) {
      const int rank = group->rank();
      const auto r = static_cast<size_t>(rank);
      const Tensor my_W = chunk_of(W, 0, c.world, rank);

      // Shard -> Replicate (all_gather); backward: the local chunk.
      Tensor shard = chunk_of(full, 0, c.world, rank).requires_grad_(true);
      Tensor y = DTensor::from_local(shard, group, Shard(0), full.shape()).redistribute(Replicate()).to_local();
      sum(y * W).backward();
      shard_to_rep[r] = shard.grad();

      // Partial -> Replicate (all_reduce); backward: identity.
      Tensor summand = integers(c.shape, 20 + rank).requires_grad_(true);
      y = DTensor::from_local(summand, group, Partial()).redistribute(Replicate()).to_local();
      sum(y * W).backward();
      partial_to_rep[r] = summand.grad();

      // Partial -> Shard (reduce_scatter); backward: all_gather.
      Tensor summand2 = integers(c.shape, 30 + rank).requires_grad_(true);
      y = DTensor::from_local(summand2, group, Partial()).redistribute(Shard(0)).to_local();
      sum(y * my_W).backward();
      partial_to_shard[r] = summand2.grad();

      // Replicate -> Shard (local chunk) through distribute_tensor; backward: all_gather.
      Tensor whole = full.clone().requires_grad_(true);
      y = distribute_tensor(whole, group, Shard(0)).to_local();
      sum(y * my_W).backward();
      rep_to_shard[r] = whole.grad();
    }));
    for (int r = 0; r < c.world; ++r) {
      CAPTURE(r);
      const auto i = static_cast<size_t>(r);
      CHECK(diff(shard_to_rep[i], chunk_of(grad, 0, c.world, r)) <= 1e-12);
      CHECK(diff(partial_to_rep[i], grad) <= 1e-12);
      CHECK(diff(partial_to_shard[i], grad) <= 1e-12);
      CHECK(diff(rep_to_shard[i], grad) <= 1e-12);
    }
  }
}

TEST_CASE("Megatron's f and g: a column-parallel then row-parallel pair, gradients as one process") {
  // y = relu(x A) B with A cut by columns and B by rows: rank r computes relu(x A_r) B_r, a
  // Partial() summand of y. f: x is Replicate() but each rank uses it differently, so its
  // gradient is read as Partial() (to_local(Partial()): all_reduce backward). g: the summands
  // are all-reduced into a Replicate() y (identity backward), whose loss every rank computes.
  const Tensor x = integers({4, 3}, 5), A = integers({3, 5}, 6), B = integers({5, 2}, 7), W = integers({4, 2}, 8);
  Tensor xr = x.clone().requires_grad_(true), Ar = A.clone().requires_grad_(true), Br = B.clone().requires_grad_(true);
  sum(matmul(relu(matmul(xr, Ar)), Br) * W).backward();

  for (int world : {2, 3}) {
    CAPTURE(world);
    const auto n = static_cast<size_t>(world);
    std::vector<Tensor> dx(n), dA(n), dB(n), dx_without_f(n);
    require_no_errors(run_ranks(world, [&](std::shared_ptr<Communicator> group) {
      const int rank = group->rank();
      const auto r = static_cast<size_t>(rank);
      for (bool with_f : {true, false}) {
        Tensor xl = x.clone().requires_grad_(true);
        Tensor a = chunk_of(A, 1, world, rank).requires_grad_(true);
        Tensor b = chunk_of(B, 0, world, rank).requires_grad_(true);
        DTensor input = DTensor::from_local(xl, group, Replicate());
        Tensor h = relu(matmul(with_f ? input.to_local(Partial()) : input.to_local(), a));
        Tensor y = DTensor::from_local(matmul(h, b), group, Partial()).redistribute(Replicate()).to_local();
        sum(y * W).backward();
        if (with_f) {
          dx[r] = xl.grad();
          dA[r] = a.grad();
          dB[r] = b.grad();
        } else {
          dx_without_f[r] = xl.grad();
        }
      }
    }));
    for (int r = 0; r < world; ++r) {
      CAPTURE(r);
      const auto i = static_cast<size_t>(r);
      CHECK(diff(dx[i], xr.grad()) <= 1e-12);
      CHECK(diff(dA[i], chunk_of(Ar.grad(), 1, world, r)) <= 1e-12);
      CHECK(diff(dB[i], chunk_of(Br.grad(), 0, world, r)) <= 1e-12);
      // Without f each rank keeps only its own columns' share of x's gradient.
      CHECK(diff(dx_without_f[i], xr.grad()) > 0);
    }
  }
}

TEST_CASE("redistribute: errors name the shapes and the supported moves") {
  require_no_errors(run_ranks(2, [&](std::shared_ptr<Communicator> group) {
    const Tensor t = integers({4, 2}, 1);
    bool threw = false;
    try {
      DTensor::from_local(t, group, Shard(0), Shape{5, 2});
    } catch (const Error& e) {
      threw = loom::testing::contains(e.what(), "local shape [") && loom::testing::contains(e.what(), "pass the global shape");
    }
    LOOM_CHECK(threw, "from_local accepted a local shape that does not fit the global one");
    threw = false;
    try {
      DTensor::from_local(t, group, Shard(0)).redistribute(Shard(1));
    } catch (const Error& e) {
      threw = loom::testing::contains(e.what(), "Shard(dim=0) -> Shard(dim=1) is not supported");
    }
    LOOM_CHECK(threw, "Shard(0) -> Shard(1) did not name the unsupported move");
    threw = false;
    try {
      distribute_tensor(t, group, Partial());
    } catch (const Error& e) {
      threw = loom::testing::contains(e.what(), "use DTensor::from_local") || loom::testing::contains(e.what(), "from_local");
    }
    LOOM_CHECK(threw, "distribute_tensor accepted Partial()");
  }));
}
