// Matrix products: mm, bmm, matmul and linear against naive loops, gradients by finite
// differences (transposed operands and matmul's broadcasting cases included), shape
// errors, and float32 accuracy of the BLAS path.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>  // defines: setenv, unsetenv
#include <vector>

#include "autograd/ops.h"
#include "gradcheck.h"
#include "tensor_compare.h"  // defines: max_abs_diff

using namespace loom;
using loom::testing::gradcheck;
using loom::testing::leaf;
using loom::testing::max_abs_diff;

namespace {

// [B, M, K] @ [B, K, N] by three loops in double; operands of any layout and dtype.
std::vector<double> naive_bmm(const Tensor& a, const Tensor& b) {
  const Tensor a3 = a.to(kFloat64).contiguous(), b3 = b.to(kFloat64).contiguous();
  const int64_t batch = a3.size(0), m = a3.size(1), k = a3.size(2), n = b3.size(2);
  const auto va = a3.tolist<double>(), vb = b3.tolist<double>();
  std::vector<double> out(static_cast<size_t>(batch * m * n), 0.0);
  for (int64_t s = 0; s < batch; ++s)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t p = 0; p < k; ++p) acc += va[(s * m + i) * k + p] * vb[(s * k + p) * n + j];
        out[(s * m + i) * n + j] = acc;
      }
  return out;
}

std::vector<double> naive_mm(const Tensor& a, const Tensor& b) { return naive_bmm(a.unsqueeze(0), b.unsqueeze(0)); }

// ||got - want|| / ||want|| (Frobenius): the error measure that is meaningful for a
// product whose individual entries may be near zero.
double relative_error(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    diff += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  return std::sqrt(diff / norm);
}

std::vector<double> values(const Tensor& t) { return t.to(kFloat64).contiguous().tolist<double>(); }

Tensor randn64(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  return randn(shape, TensorOptions(kFloat64), &gen);
}

}  // namespace

TEST_CASE("mm matches hand-computed values and a naive loop") {
  Tensor a = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = from_vector<float>({7, 8, 9, 10, 11, 12}, {3, 2});
  CHECK(mm(a, b).tolist<float>() == std::vector<float>{58, 64, 139, 154});
  CHECK(a.matmul(b).tolist<float>() == std::vector<float>{58, 64, 139, 154});

  Tensor x = randn64({5, 7}, 1), y = randn64({7, 3}, 2);
  CHECK(relative_error(values(mm(x, y)), naive_mm(x, y)) < 1e-14);
}

TEST_CASE("mm reads transposed views in place and copies only what BLAS cannot read") {
  Tensor x = randn64({6, 4}, 3), y = randn64({5, 6}, 4);
  // x^T [4, 6] and y^T [6, 5]: unit stride in the row dim, passed as CblasTrans.
  CHECK(relative_error(values(mm(x.t(), y.t())), naive_mm(x.t(), y.t())) < 1e-14);
  CHECK(relative_error(values(mm(y, x)), naive_mm(y, x)) < 1e-14);
  // Every other column: no unit stride, so the op makes it contiguous first.
  Tensor wide = randn64({4, 10}, 5);
  Tensor strided = wide.slice(1, 0, 10, 2);  // [4, 5], strides [10, 2]
  CHECK(relative_error(values(mm(strided, y)), naive_mm(strided, y)) < 1e-14);
  // An expanded operand (stride 0) is copied too.
  Tensor row = randn64({1, 6}, 6).expand({4, 6});
  CHECK(relative_error(values(mm(row, x)), naive_mm(row, x)) < 1e-14);
  // Single rows/columns have meaningless strides in their size-1 dim.
  Tensor column = randn64({6}, 7).unsqueeze(1);
  CHECK(relative_error(values(mm(y, column)), naive_mm(y, column)) < 1e-14);
  // Empty inner dim: a zero matrix. Empty outer dims: an empty result.
  CHECK(mm(zeros({3, 0}), zeros({0, 2})).tolist<float>() == std::vector<float>(6, 0.0f));
  CHECK(mm(zeros({0, 4}), zeros({4, 2})).shape() == Shape{0, 2});
}

TEST_CASE("the mm kernel explains an operand it cannot read") {
  Tensor wide = zeros({4, 10});
  Tensor strided = wide.slice(1, 0, 10, 2);
  Tensor out = empty({4, 4});
  CHECK_THROWS_WITH_AS(mm_kernel(out.device())(strided, zeros({5, 4}), 0.0, out), doctest::Contains("unit stride"),
                       Error);
  CHECK_THROWS_WITH_AS(mm_kernel(out.device())(zeros({4, 5}, kInt64), zeros({5, 4}, kInt64), 0.0, out),
                       doctest::Contains("mm: expected a float32 or float64 tensor, got int64"), Error);
  // beta = 1 accumulates into the output.
  Tensor acc = ones({2, 2});
  mm_kernel(acc.device())(ones({2, 3}), ones({3, 2}), 1.0, acc);
  CHECK(acc.tolist<float>() == std::vector<float>{4, 4, 4, 4});
}

TEST_CASE("bmm over batches, serial or threaded, with a broadcast batch") {
  // Small matrices: threads split the batch. One large matrix: BLAS threads the gemm.
  for (Shape dims : {Shape{8, 3, 4, 5}, Shape{1, 90, 80, 70}, Shape{3, 70, 80, 90}}) {
    Tensor a = randn64({dims[0], dims[1], dims[2]}, 8), b = randn64({dims[0], dims[2], dims[3]}, 9);
    CHECK(relative_error(values(bmm(a, b)), naive_bmm(a, b)) < 1e-13);
    // Transposed matrices inside the batch.
    Tensor at = a.transpose(1, 2).contiguous().transpose(1, 2);
    CHECK(relative_error(values(bmm(at, b)), naive_bmm(a, b)) < 1e-13);
  }
  // One matrix shared by the whole batch: batch stride 0, read in place.
  Tensor a = randn64({4, 3, 5}, 10);
  Tensor shared = randn64({1, 5, 2}, 11).expand({4, 5, 2});
  CHECK(relative_error(values(bmm(a, shared)), naive_bmm(a, shared)) < 1e-14);
}

TEST_CASE("matmul follows torch.matmul's rules for every rank") {
  Tensor v = from_vector<double>({1, 2, 3}, {3});
  Tensor w = from_vector<double>({4, 5, 6}, {3});
  Tensor dot = matmul(v, w);
  CHECK(dot.dim() == 0);
  CHECK(dot.item<double>() == 32);

  Tensor m = from_vector<double>({1, 0, 2, 1, 1, 0}, {3, 2});  // [3, 2]
  CHECK(matmul(v, m).shape() == Shape{2});
  CHECK(matmul(v, m).tolist<double>() == std::vector<double>{8, 2});
  CHECK(matmul(m.t(), v).tolist<double>() == std::vector<double>{8, 2});

  // N-D @ 2-D and N-D @ 1-D fold the batch into rows.
  Tensor a = randn64({2, 3, 4, 5}, 12), b = randn64({5, 6}, 13);
  Tensor ab = matmul(a, b);
  CHECK(ab.shape() == Shape{2, 3, 4, 6});
  CHECK(relative_error(values(ab), naive_mm(a.reshape({24, 5}), b)) < 1e-14);
  Tensor c = randn64({5}, 14);
  CHECK(matmul(a, c).shape() == Shape{2, 3, 4});
  CHECK(relative_error(values(matmul(a, c)), naive_mm(a.reshape({24, 5}), c.unsqueeze(1))) < 1e-14);

  // 1-D @ N-D: the vector is a row, then dropped.
  Tensor d = randn64({4}, 15);
  CHECK(matmul(d, a).shape() == Shape{2, 3, 5});
  CHECK(relative_error(values(matmul(d, a)), naive_bmm(d.reshape({1, 1, 4}).expand({6, 1, 4}), a.reshape({6, 4, 5}))) <
        1e-14);

  // Batch dims broadcast: [2, 1, 4, 5] @ [3, 5, 6] -> [2, 3, 4, 6].
  Tensor e = randn64({2, 1, 4, 5}, 16), f = randn64({3, 5, 6}, 17);
  Tensor ef = matmul(e, f);
  CHECK(ef.shape() == Shape{2, 3, 4, 6});
  Tensor e_full = e.expand({2, 3, 4, 5}).reshape({6, 4, 5});
  Tensor f_full = f.unsqueeze(0).expand({2, 3, 5, 6}).reshape({6, 5, 6});
  CHECK(relative_error(values(ef), naive_bmm(e_full, f_full)) < 1e-14);
  // 2-D @ N-D broadcasts the matrix over the batch.
  CHECK(matmul(m.t(), randn64({4, 3, 2}, 18)).shape() == Shape{4, 2, 2});
}

TEST_CASE("linear with and without bias, for 1-D, 2-D and 3-D inputs") {
  Tensor x = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor weight = from_vector<float>({1, 0, 0, 0, 1, 1}, {2, 3});  // out = [x0, x1 + x2]
  Tensor bias = from_vector<float>({10, 20}, {2});
  CHECK(linear(x, weight).tolist<float>() == std::vector<float>{1, 5, 4, 11});
  CHECK(linear(x, weight, bias).tolist<float>() == std::vector<float>{11, 25, 14, 31});
  CHECK(linear(from_vector<float>({1, 2, 3}, {3}), weight, bias).tolist<float>() == std::vector<float>{11, 25});
  Tensor x3 = randn64({2, 4, 3}, 19);
  Tensor w = randn64({5, 3}, 20), bias5 = randn64({5}, 21);
  Tensor y = linear(x3, w, bias5);
  CHECK(y.shape() == Shape{2, 4, 5});
  CHECK(relative_error(values(y), values(matmul(x3, w.t()) + bias5)) < 1e-14);
}

TEST_CASE("gradients of mm, bmm and linear, with transposed operands") {
  Tensor a = leaf({3, 4}, 1), b = leaf({4, 5}, 2), c = leaf({5, 4}, 3), d = leaf({5, 3}, 15);
  gradcheck([](const auto& in) { return mm(in[0], in[1]); }, {a, b});
  gradcheck([](const auto& in) { return mm(in[0], in[1].t()); }, {a, c});
  gradcheck([](const auto& in) { return mm(in[0].t(), in[1].t()); }, {a, d});
  Tensor p = leaf({2, 3, 4}, 4), q = leaf({2, 4, 5}, 5), r = leaf({2, 5, 4}, 6);
  gradcheck([](const auto& in) { return bmm(in[0], in[1]); }, {p, q});
  gradcheck([](const auto& in) { return bmm(in[0], in[1].transpose(1, 2)); }, {p, r});
  // One operand without grad: only the other's gradient is computed.
  Tensor fixed = randn64({4, 5}, 7);
  gradcheck([&](const auto& in) { return mm(in[0], fixed); }, {a});

  Tensor x = leaf({4, 3}, 8), weight = leaf({5, 3}, 9), bias = leaf({5}, 10);
  gradcheck([](const auto& in) { return linear(in[0], in[1], in[2]); }, {x, weight, bias});
  gradcheck([](const auto& in) { return linear(in[0], in[1]); }, {x, weight});
  Tensor x3 = leaf({2, 3, 3}, 11), x1 = leaf({3}, 12);
  gradcheck([](const auto& in) { return linear(in[0], in[1], in[2]); }, {x3, weight, bias});
  gradcheck([](const auto& in) { return linear(in[0], in[1], in[2]); }, {x1, weight, bias});
  // A weight stored transposed ([in, out], used as .t()).
  Tensor weight_t = leaf({3, 5}, 13);
  gradcheck([](const auto& in) { return linear(in[0], in[1].t(), in[2]); }, {x, weight_t, bias});
  // A bias that does not require grad.
  Tensor plain_bias = randn64({5}, 14);
  gradcheck([&](const auto& in) { return linear(in[0], in[1], plain_bias); }, {x, weight});
}

TEST_CASE("gradients of matmul in each of its cases") {
  Tensor v = leaf({4}, 1), w = leaf({4}, 2), m = leaf({4, 3}, 3), n = leaf({3, 4}, 4);
  gradcheck([](const auto& in) { return matmul(in[0], in[1]); }, {v, w});  // dot
  gradcheck([](const auto& in) { return matmul(in[0], in[1]); }, {v, m});  // vector @ matrix
  gradcheck([](const auto& in) { return matmul(in[0], in[1]); }, {n, v});  // matrix @ vector
  gradcheck([](const auto& in) { return matmul(in[0], in[1]); }, {n, m});  // mm
  Tensor a = leaf({2, 3, 4}, 5), b = leaf({2, 4, 2}, 6);
  gradcheck([](const auto& in) { return matmul(in[0], in[1]); }, {a, b});  // bmm
  gradcheck([](const auto& in) { return matmul(in[0], in[1]); }, {a, m});  // folded into mm
  gradcheck([](const auto& in) { return matmul(in[0], in[1]); }, {a, v});  // N-D @ 1-D
  Tensor c = leaf({3}, 7);
  gradcheck([](const auto& in) { return matmul(in[0], in[1]); }, {c, a});  // 1-D @ N-D
  // Broadcast batch dims: gradients are summed over the dims each operand was expanded in.
  Tensor e = leaf({2, 1, 3, 4}, 8), f = leaf({3, 4, 2}, 9);
  gradcheck([](const auto& in) { return matmul(in[0], in[1]); }, {e, f});
  gradcheck([](const auto& in) { return matmul(in[0], in[1]); }, {m, e});  // 2-D @ N-D
  // Transposed batched operands.
  Tensor g = leaf({2, 2, 4}, 10);
  gradcheck([](const auto& in) { return matmul(in[0], in[1].transpose(-1, -2)); }, {a, g});
}

TEST_CASE("shape and dtype errors name what was expected and what came") {
  CHECK_THROWS_WITH_AS(mm(zeros({2, 3}), zeros({4, 5})),
                       doctest::Contains("mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)"), Error);
  CHECK_THROWS_WITH_AS(matmul(zeros({2, 3}), zeros({4, 5})), doctest::Contains("[2, 3] and [4, 5]"), Error);
  CHECK_THROWS_WITH_AS(matmul(zeros({3}), zeros({4})), doctest::Contains("same size"), Error);
  CHECK_THROWS_WITH_AS(matmul(zeros({2, 2, 3}), zeros({3, 3, 4})), doctest::Contains("do not broadcast"), Error);
  CHECK_THROWS_WITH_AS(mm(zeros({2, 3, 1}), zeros({1, 5})), doctest::Contains("expected 2-D"), Error);
  CHECK_THROWS_WITH_AS(bmm(zeros({2, 2, 3}), zeros({3, 3, 4})), doctest::Contains("batch sizes differ"), Error);
  CHECK_THROWS_WITH_AS(bmm(zeros({2, 2, 3}), zeros({2, 4, 4})), doctest::Contains("[2, 2, 3] and [2, 4, 4]"), Error);
  CHECK_THROWS_WITH_AS(linear(zeros({4, 3}), zeros({5, 2})),
                       doctest::Contains("mat1 and mat2 shapes cannot be multiplied (4x3 and 2x5)"), Error);
  CHECK_THROWS_WITH_AS(linear(zeros({4, 3}), zeros({5, 3}), zeros({4})), doctest::Contains("bias of shape [5]"),
                       Error);
  CHECK_THROWS_WITH_AS(mm(zeros({2, 2}, kInt64), zeros({2, 2}, kInt64)), doctest::Contains("integer"), Error);
  CHECK_THROWS_WITH_AS(mm(zeros({2, 2}), zeros({2, 2}, kFloat64)), doctest::Contains("same dtype"), Error);
}

TEST_CASE("float32 matmul on 256x300x200 agrees with a double reference") {
  Generator gen(42);
  Tensor a = randn({256, 300}, {}, &gen), b = randn({300, 200}, {}, &gen);
  CHECK(relative_error(values(matmul(a, b)), naive_mm(a, b)) < 1e-5);
  CHECK(relative_error(values(matmul(b.t(), a.t())), naive_mm(b.t(), a.t())) < 1e-5);
  Tensor bias = randn({200}, {}, &gen);
  Tensor reference = from_vector(naive_mm(a, b), {256, 200}) + bias.to(kFloat64);
  CHECK(relative_error(values(linear(a, b.t(), bias)), values(reference)) < 1e-5);
}

// Note [float32 matmul on oneDNN] (core/cpu/linalg.cpp): from 128 x 128 x 256
// multiply-adds a float32 mm runs on oneDNN where the CPU has AVX-512, on OpenBLAS
// otherwise (and under LOOM_CPU_ISA=avx2). Both must read every operand layout and
// accumulate with beta = 1; both paths are run here, on any CPU.
TEST_CASE("large float32 mm, on oneDNN and on OpenBLAS: transposed operands, a wider row stride, beta 1") {
  Generator gen(43);
  Tensor a = randn({260, 300}, {}, &gen), b = randn({300, 270}, {}, &gen);
  Tensor wide = randn({300, 290}, {}, &gen).slice(1, 0, 270);  // row stride 290 > width 270
  for (const char* isa : {"native", "avx2"}) {
    CAPTURE(isa);
    setenv("LOOM_CPU_ISA", isa, 1);
    CHECK(relative_error(values(mm(a, b)), naive_mm(a, b)) < 1e-5);
    CHECK(relative_error(values(mm(b.t(), a.t())), naive_mm(b.t(), a.t())) < 1e-5);
    CHECK(relative_error(values(mm(a, wide)), naive_mm(a, wide)) < 1e-5);
    Tensor acc = ones({260, 270});
    mm_kernel(acc.device())(a, b, 1.0, acc);
    std::vector<double> want = naive_mm(a, b);
    for (double& w : want) w += 1.0;
    CHECK(relative_error(values(acc), want) < 1e-5);
    // The same product twice gives the same bits (what the transparency tests rely on).
    CHECK(max_abs_diff(mm(a, b), mm(a, b)) == 0.0);
  }
  unsetenv("LOOM_CPU_ISA");
}

// Not run by default (`test_linalg -ns -tc='*GFLOP*'` runs it): sgemm throughput of mm.
TEST_CASE("mm float32 2048^3 GFLOP/s" * doctest::skip()) {
  const int64_t n = 2048;
  Tensor a = randn({n, n}), b = randn({n, n});
  (void)mm(a, b);  // warm-up: thread pool and page faults
  std::vector<double> rates;
  for (int rep = 0; rep < 7; ++rep) {
    auto start = std::chrono::steady_clock::now();
    (void)mm(a, b);
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    rates.push_back(2.0 * n * n * n / seconds / 1e9);
  }
  std::sort(rates.begin(), rates.end());
  std::printf("mm 2048^3 float32: median %.1f GFLOP/s (min %.1f, max %.1f)\n", rates[rates.size() / 2], rates.front(),
              rates.back());
}
