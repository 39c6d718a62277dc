// distributed_gradcheck: gradcheck (tests/gradcheck.h) for an op whose forward and
// backward are collectives, such as sync_batch_norm. Ranks are threads (rank_threads.h).
//
//   distributed_gradcheck(3, [](Communicator& comm, const std::vector<Tensor>& in) {
//     return op_on_this_ranks_shard(comm, in);
//   }, {x, weight, bias});
//
// Every rank holds its own copy of the same inputs and f returns this rank's output, so
// the function checked is L = sum over ranks r of sum(f_r(inputs) * w_r), with fixed
// random weights w_r. An input that every rank holds is one variable of L: its gradient
// is the sum of the ranks' autograd gradients (one all_reduce), and a finite difference
// perturbs that element on every rank at once. Each rank's term of L(x ± eps) is summed
// with one all_reduce, so every rank issues the same collectives in the same order, and
// every rank compares the same reduced numbers: all stop at the same mismatch, and
// none is left waiting in a collective for a rank that gave up.
#pragma once

#include <cmath>
#include <functional>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "core/error.h"
#include "rank_threads.h"

namespace loom::testing {

using DistributedFn = std::function<Tensor(distributed::Communicator&, const std::vector<Tensor>&)>;

// Inputs must be float64, contiguous, on CPU; those with requires_grad are checked.
inline void distributed_gradcheck(int world, const DistributedFn& f, const std::vector<Tensor>& inputs,
                                  double eps = 1e-6, double atol = 1e-6, double rtol = 1e-4) {
  for (const Tensor& input : inputs) {
    REQUIRE(input.dtype() == kFloat64);
    REQUIRE(input.is_contiguous());
  }
  require_no_errors(run_ranks(world, [&](std::shared_ptr<distributed::Communicator> comm) {
    const int rank = comm->rank();
    std::vector<Tensor> mine;  // this rank's copy: perturbing it must not touch the others'
    for (const Tensor& input : inputs) mine.push_back(input.detach().clone().requires_grad_(input.requires_grad()));
    Generator gen(1234 + static_cast<uint64_t>(rank));
    const Tensor weights = randn(f(*comm, mine).shape(), TensorOptions(kFloat64), &gen);
    auto objective = [&] { return sum(f(*comm, mine) * weights); };
    auto summed_over_ranks = [&](Tensor t) {
      t = t.contiguous().clone();
      comm->all_reduce(t)->wait();
      return t;
    };

    objective().backward();
    NoGradGuard no_grad;
    for (size_t k = 0; k < mine.size(); ++k) {
      if (!inputs[k].requires_grad()) continue;
      // A rank whose output does not depend on the input contributes zeros (a missing
      // gradient everywhere then shows as a mismatch, on every rank alike).
      const Tensor grad = mine[k].grad().defined() ? mine[k].grad() : zeros_like(mine[k]);
      const auto analytic = summed_over_ranks(grad).tolist<double>();
      double* x = mine[k].data_ptr<double>();
      for (int64_t i = 0; i < mine[k].numel(); ++i) {
        const double saved = x[i];
        x[i] = saved + eps;
        const double plus = summed_over_ranks(objective()).item<double>();
        x[i] = saved - eps;
        const double minus = summed_over_ranks(objective()).item<double>();
        x[i] = saved;
        const double numeric = (plus - minus) / (2 * eps);
        const double got = analytic[static_cast<size_t>(i)];
        LOOM_CHECK(std::abs(got - numeric) <= atol + rtol * std::abs(numeric), "gradient mismatch for input ", k,
                   " element ", i, ": analytic ", got, " vs numeric ", numeric);
      }
    }
  }));
}

}  // namespace loom::testing
