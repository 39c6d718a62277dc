// The CUDA backend's kernels against the CPU backend's on the same random inputs: unary,
// binary (broadcast operands), pow/clamp/where/threshold_backward/fill, 16-bit floats,
// reductions along every layout path, max/min along a dim, cuBLAS mm and bmm, cuDNN
// convolutions, and random numbers. Without a GPU every case is skipped
// (tests/test_cuda.cpp's "CUDA availability" prints why).
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "autograd/ops.h"
#include "core/factory.h"
#include "core/kernels.h"
#include "cuda/backends.h"   // defines: set_allow_tf32, set_cudnn_allow_tf32
#include "cuda/device.h"     // defines: is_available
#include "device_compare.h"  // defines: kCpu, kCuda0, to_device, gpu_empty, check_close, random_cpu

using namespace loom;

using namespace loom::testing;

namespace {

// Evaluated at static initialisation, before the TEST_CASEs below register (same
// translation unit, so in order), so that the skip decorators can read it.
const bool kGpu = cuda::is_available();

}  // namespace

TEST_SUITE("cuda kernels (need a GPU)") {

TEST_CASE("unary kernels match the CPU" * doctest::skip(!kGpu)) {
  const UnaryOp ops[] = {UnaryOp::Neg, UnaryOp::Exp, UnaryOp::Log, UnaryOp::Sqrt, UnaryOp::Rsqrt,
                         UnaryOp::Abs, UnaryOp::Relu, UnaryOp::Sigmoid, UnaryOp::Tanh};
  for (DType dtype : {kFloat32, kFloat64}) {
    for (UnaryOp op : ops) {
      const bool positive = op == UnaryOp::Log || op == UnaryOp::Sqrt || op == UnaryOp::Rsqrt;
      Tensor x = random_cpu({61, 129}, dtype, positive ? 0.01 : -4.0, 4.0, 7);
      for (bool strided : {false, true}) {
        INFO("dtype ", dtype, ", op ", static_cast<int>(op), strided ? ", strided" : ", contiguous");
        Tensor in = strided ? x.transpose(0, 1) : x;
        Tensor expected = empty(in.shape(), dtype);
        unary_kernel(kCpu)(op, in, expected);
        Tensor in_gpu = strided ? to_device(x, kCuda0).transpose(0, 1) : to_device(x, kCuda0);
        Tensor got = gpu_empty(in.shape(), dtype);
        unary_kernel(kCuda0)(op, in_gpu, got);
        check_close(got, expected, 1e-5, 1e-30);
      }
    }
  }
}

TEST_CASE("binary kernels and comparisons match the CPU, with broadcast operands" * doctest::skip(!kGpu)) {
  const BinaryOp ops[] = {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Maximum,
                          BinaryOp::Minimum, BinaryOp::Eq, BinaryOp::Ne, BinaryOp::Lt, BinaryOp::Le,
                          BinaryOp::Gt, BinaryOp::Ge};
  for (DType dtype : {kFloat32, kFloat64, kInt64}) {
    Tensor a = random_cpu({33, 70}, dtype, 1, 9, 3);
    Tensor b_row = random_cpu({1, 70}, dtype, 1, 9, 4);  // broadcast along dim 0: stride 0
    Tensor b = b_row.expand({33, 70});
    Tensor a_gpu = to_device(a, kCuda0), b_gpu = to_device(b_row, kCuda0).expand({33, 70});
    for (BinaryOp op : ops) {
      for (double alpha : {1.0, 0.5}) {
        if (alpha != 1.0 && op != BinaryOp::Add && op != BinaryOp::Sub) continue;
        INFO("dtype ", dtype, ", op ", static_cast<int>(op), ", alpha ", alpha);
        const DType out_dtype = op >= BinaryOp::Eq ? kBool : dtype;
        Tensor expected = empty({33, 70}, out_dtype);
        binary_kernel(kCpu)(op, a, b, alpha, expected);
        Tensor got = gpu_empty({33, 70}, out_dtype);
        binary_kernel(kCuda0)(op, a_gpu, b_gpu, alpha, got);
        check_close(got, expected, 1e-6);
      }
    }
  }
}

TEST_CASE("pow, clamp, where, threshold_backward and fill match the CPU" * doctest::skip(!kGpu)) {
  for (DType dtype : {kFloat32, kFloat64}) {
    INFO("dtype ", dtype);
    Tensor x = random_cpu({45, 67}, dtype, 0.1, 3.0, 5);
    Tensor g = random_cpu({45, 67}, dtype, -1.0, 1.0, 6);
    Tensor x_gpu = to_device(x, kCuda0), g_gpu = to_device(g, kCuda0);
    for (double e : {2.0, 0.5, -1.5}) {
      Tensor expected = empty(x.shape(), dtype), got = gpu_empty(x.shape(), dtype);
      pow_scalar_kernel(kCpu)(x, e, expected);
      pow_scalar_kernel(kCuda0)(x_gpu, e, got);
      check_close(got, expected, 1e-5);
    }
    Tensor expected = empty(x.shape(), dtype), got = gpu_empty(x.shape(), dtype);
    clamp_kernel(kCpu)(x, 0.5, 2.0, expected);
    clamp_kernel(kCuda0)(x_gpu, 0.5, 2.0, got);
    check_close(got, expected, 0.0);
    threshold_backward_kernel(kCpu)(g, x, 1.5, expected);
    threshold_backward_kernel(kCuda0)(g_gpu, x_gpu, 1.5, got);
    check_close(got, expected, 0.0);
    Tensor cond = empty(x.shape(), kBool), cond_gpu = gpu_empty(x.shape(), kBool);
    binary_kernel(kCpu)(BinaryOp::Gt, x, to_device(g, kCpu), 1.0, cond);
    binary_kernel(kCuda0)(BinaryOp::Gt, x_gpu, g_gpu, 1.0, cond_gpu);
    where_kernel(kCpu)(cond, x, g, expected);
    where_kernel(kCuda0)(cond_gpu, x_gpu, g_gpu, got);
    check_close(got, expected, 0.0);
  }
  for (DType dtype : {kFloat32, kFloat64, kInt64, kInt32, kUInt8, kBool, kFloat16, kBFloat16}) {
    INFO("fill, dtype ", dtype);
    Tensor expected = empty({9, 14}, dtype), got = gpu_empty({14, 9}, dtype).transpose(0, 1);  // strided fill
    fill_kernel(kCpu)(expected, 3.0);
    fill_kernel(kCuda0)(got, 3.0);
    check_close(got, expected, 0.0);
  }
}

TEST_CASE("16-bit floats compute in float and round like the CPU's conversion" * doctest::skip(!kGpu)) {
  for (DType dtype : {kFloat16, kBFloat16}) {
    INFO("dtype ", dtype);
    const double tol = dtype == kFloat16 ? 1e-3 : 8e-3;  // one rounding of the result
    Tensor a16 = to_device(random_cpu({40, 50}, kFloat32, 0.1, 4, 8), kCpu, dtype);
    Tensor b16 = to_device(random_cpu({40, 50}, kFloat32, 0.1, 4, 9), kCpu, dtype);
    Tensor a = to_device(a16, kCpu, kFloat32), b = to_device(b16, kCpu, kFloat32);  // exact widenings
    Tensor a_gpu = to_device(a16, kCuda0), b_gpu = to_device(b16, kCuda0);
    for (UnaryOp op : {UnaryOp::Exp, UnaryOp::Log, UnaryOp::Sigmoid, UnaryOp::Relu}) {
      Tensor expected = empty(a.shape(), kFloat32), got = gpu_empty(a.shape(), dtype);
      unary_kernel(kCpu)(op, a, expected);
      unary_kernel(kCuda0)(op, a_gpu, got);
      check_close(got, expected, tol);
    }
    for (BinaryOp op : {BinaryOp::Add, BinaryOp::Mul, BinaryOp::Div}) {
      Tensor expected = empty(a.shape(), kFloat32), got = gpu_empty(a.shape(), dtype);
      binary_kernel(kCpu)(op, a, b, 1.0, expected);
      binary_kernel(kCuda0)(op, a_gpu, b_gpu, 1.0, got);
      check_close(got, expected, tol);
    }
  }
}

TEST_CASE("reductions match the CPU for every layout path" * doctest::skip(!kGpu)) {
  // Shapes exercise: rows (reduce the last dims), columns (reduce the first dims),
  // packed (reduce a middle dim), and two-stage splits (few outputs, long rows/columns).
  const std::vector<std::pair<Shape, std::vector<Shape>>> cases = {
      {{5, 7, 300}, {{0}, {1}, {2}, {0, 1}, {0, 2}, {1, 2}, {0, 1, 2}}},
      {{3, 200000}, {{1}, {0}, {0, 1}}},
      {{100000, 8}, {{0}, {1}}},
      {{1 << 20}, {{0}}},
  };
  for (DType dtype : {kFloat32, kFloat64, kInt64}) {
    for (const auto& [case_shape, dim_sets] : cases) {
      const Shape& shape = case_shape;  // See Note [doctest messages name no structured binding]
      Tensor x = random_cpu(shape, dtype, -5, 5, 10);
      Tensor x_gpu = to_device(x, kCuda0);
      for (const Shape& dims : dim_sets) {
        Shape out_shape = shape;
        for (int64_t d : dims) out_shape[static_cast<size_t>(d)] = 1;
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min}) {
          INFO("dtype ", dtype, ", shape ", shape, ", dims ", dims, ", op ", static_cast<int>(op));
          Tensor expected = empty(out_shape, dtype), got = gpu_empty(out_shape, dtype);
          reduce_kernel(kCpu)(op, x, dims, expected);
          reduce_kernel(kCuda0)(op, x_gpu, dims, got);
          check_close(got, expected, 1e-5, 1e-5);
        }
      }
    }
  }
  // A strided input (transposed view) goes through the packing path.
  Tensor x = random_cpu({64, 90}, kFloat32, -1, 1, 12);
  Tensor expected = empty({90, 1}, kFloat32), got = gpu_empty({90, 1}, kFloat32);
  reduce_kernel(kCpu)(ReduceOp::Sum, x.transpose(0, 1), {1}, expected);
  reduce_kernel(kCuda0)(ReduceOp::Sum, to_device(x, kCuda0).transpose(0, 1), {1}, got);
  check_close(got, expected, 1e-5, 1e-6);
}

TEST_CASE("max/min along a dim return the first extreme, as the CPU" * doctest::skip(!kGpu)) {
  // 16-bit too: the trainer's accuracy takes argmax of autocast's fp16/bf16 logits.
  for (DType dtype : {kFloat32, kFloat64, kInt64, kFloat16, kBFloat16}) {
    // Small integers (exact in every dtype): many ties.
    Tensor x = to_device(random_cpu({31, 17, 45}, kInt64, 0, 6, 13), kCpu, dtype);
    Tensor x_gpu = to_device(x, kCuda0);
    for (int64_t dim : {0, 1, 2}) {
      for (bool is_max : {true, false}) {
        INFO("dtype ", dtype, ", dim ", dim, is_max ? ", max" : ", min");
        Shape out_shape = x.shape();
        out_shape[static_cast<size_t>(dim)] = 1;
        Tensor values = empty(out_shape, dtype), indices = empty(out_shape, kInt64);
        Tensor values_gpu = gpu_empty(out_shape, dtype), indices_gpu = gpu_empty(out_shape, kInt64);
        max_min_dim_kernel(kCpu)(is_max, x, dim, values, indices);
        max_min_dim_kernel(kCuda0)(is_max, x_gpu, dim, values_gpu, indices_gpu);
        check_close(values_gpu, values, 0.0);
        check_close(indices_gpu, indices, 0.0);
      }
    }
  }
}

// NaNs scattered through rows longer than a block (so across warps and blocks), among
// ties: max, min and argmax pick the first NaN, and full reductions return NaN, as the
// CPU does (untested on a GPU so far: none has been lent).
TEST_CASE("max/min with NaNs: the first NaN wins along a dim and overall, as the CPU" * doctest::skip(!kGpu)) {
  for (DType dtype : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
    Tensor x = to_device(random_cpu({6, 1000}, kInt64, 0, 6, 17), kCpu, kFloat64);
    auto values = x.tolist<double>();
    for (int64_t row = 0; row < 5; ++row)  // row 5 has no NaN
      for (int64_t k = 0; k <= row; ++k) values[static_cast<size_t>(row * 1000 + 300 * k + 7 * row)] = std::nan("");
    x = to_device(from_vector<double>(values, {6, 1000}), kCpu, dtype);
    Tensor x_gpu = to_device(x, kCuda0);
    for (bool is_max : {true, false}) {
      INFO("dtype ", dtype, is_max ? ", max" : ", min");
      Tensor v = empty({6, 1}, dtype), i = empty({6, 1}, kInt64);
      Tensor v_gpu = gpu_empty({6, 1}, dtype), i_gpu = gpu_empty({6, 1}, kInt64);
      max_min_dim_kernel(kCpu)(is_max, x, 1, v, i);
      max_min_dim_kernel(kCuda0)(is_max, x_gpu, 1, v_gpu, i_gpu);
      check_close(v_gpu, v, 0.0);  // NaN matches NaN
      check_close(i_gpu, i, 0.0);
      Tensor all = empty({1, 1}, dtype), all_gpu = gpu_empty({1, 1}, dtype);  // keepdim-shaped
      reduce_kernel(kCpu)(is_max ? ReduceOp::Max : ReduceOp::Min, x, {0, 1}, all);
      reduce_kernel(kCuda0)(is_max ? ReduceOp::Max : ReduceOp::Min, x_gpu, {0, 1}, all_gpu);
      CHECK(std::isnan(host_values(all_gpu)[0]));
      CHECK(std::isnan(host_values(all)[0]));
    }
  }
}

TEST_CASE("mm and bmm through cuBLAS match a float64 reference, transposed views included" * doctest::skip(!kGpu)) {
  cuda::set_allow_tf32(false);
  const int64_t M = 37, K = 53, N = 29, B = 3;
  for (DType dtype : {kFloat32, kFloat64}) {
    Tensor a = random_cpu({M, K}, dtype, -1, 1, 20), b = random_cpu({K, N}, dtype, -1, 1, 21);
    auto av = host_values(a), bv = host_values(b);
    std::vector<double> ref(static_cast<size_t>(M * N), 0.0);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j)
        for (int64_t k = 0; k < K; ++k) ref[static_cast<size_t>(i * N + j)] += av[static_cast<size_t>(i * K + k)] * bv[static_cast<size_t>(k * N + j)];
    Tensor expected = from_vector<double>(ref, {M, N});
    // As given, and as transposed views of transposed copies (op T on both sides).
    Tensor a_gpu = to_device(a, kCuda0), b_gpu = to_device(b, kCuda0);
    Tensor a_t = to_device(a.transpose(0, 1), kCuda0).transpose(0, 1);  // [M, K], column-major
    Tensor b_t = to_device(b.transpose(0, 1), kCuda0).transpose(0, 1);
    for (auto [lhs, rhs] : {std::pair{a_gpu, b_gpu}, std::pair{a_t, b_t}, std::pair{a_gpu, b_t}}) {
      Tensor out = gpu_empty({M, N}, dtype);
      mm_kernel(kCuda0)(lhs, rhs, 0.0, out);
      check_close(out, expected, 1e-5, 1e-5);
      mm_kernel(kCuda0)(lhs, rhs, 1.0, out);  // beta = 1 accumulates: 2x
      Tensor twice = to_device(expected, kCpu, kFloat64) * 2.0;
      check_close(out, twice, 1e-5, 1e-5);
    }
    // bmm: B copies of the same product.
    Tensor a3 = to_device(a.unsqueeze(0).expand({B, M, K}).contiguous(), kCuda0);
    Tensor b3 = to_device(b.unsqueeze(0).expand({B, K, N}).contiguous(), kCuda0);
    Tensor out3 = gpu_empty({B, M, N}, dtype);
    bmm_kernel(kCuda0)(a3, b3, out3);
    check_close(out3, expected.unsqueeze(0).expand({B, M, N}).contiguous(), 1e-5, 1e-5);
  }
}

TEST_CASE("conv2d forward and backward through cuDNN match a float64 reference" * doctest::skip(!kGpu)) {
  cuda::set_cudnn_allow_tf32(false);
  const int64_t N = 2, C = 4, H = 9, W = 11, O = 6, G = 2, KH = 3, KW = 3;
  Conv2dParams p;
  p.stride[0] = 2;
  p.padding[0] = 1;
  p.padding[1] = 2;
  p.dilation[1] = 2;
  p.groups = G;
  const int64_t OH = (H + 2 * p.padding[0] - p.dilation[0] * (KH - 1) - 1) / p.stride[0] + 1;
  const int64_t OW = (W + 2 * p.padding[1] - p.dilation[1] * (KW - 1) - 1) / p.stride[1] + 1;
  const int64_t Cg = C / G, Og = O / G;
  // Visits every (input, weight, output) index triple of the convolution.
  auto for_each_tap = [&](auto&& visit) {
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < O; ++o)
        for (int64_t oy = 0; oy < OH; ++oy)
          for (int64_t ox = 0; ox < OW; ++ox)
            for (int64_t c = 0; c < Cg; ++c)
              for (int64_t ky = 0; ky < KH; ++ky)
                for (int64_t kx = 0; kx < KW; ++kx) {
                  const int64_t y = oy * p.stride[0] - p.padding[0] + ky * p.dilation[0];
                  const int64_t x = ox * p.stride[1] - p.padding[1] + kx * p.dilation[1];
                  if (y < 0 || y >= H || x < 0 || x >= W) continue;
                  const int64_t ci = (o / Og) * Cg + c;
                  visit(static_cast<size_t>(((n * C + ci) * H + y) * W + x), static_cast<size_t>(((o * Cg + c) * KH + ky) * KW + kx),
                        static_cast<size_t>(((n * O + o) * OH + oy) * OW + ox));
                }
  };
  for (DType dtype : {kFloat32, kFloat64}) {
    INFO("dtype ", dtype);
    Tensor in = random_cpu({N, C, H, W}, dtype, -1, 1, 40), w = random_cpu({O, Cg, KH, KW}, dtype, -1, 1, 41);
    Tensor b = random_cpu({O}, dtype, -1, 1, 42), g = random_cpu({N, O, OH, OW}, dtype, -1, 1, 43);
    auto iv = host_values(in), wv = host_values(w), bv = host_values(b), gv = host_values(g);
    std::vector<double> out(static_cast<size_t>(N * O * OH * OW)), gi(iv.size(), 0.0), gw(wv.size(), 0.0), gb(bv.size(), 0.0);
    for (size_t i = 0; i < out.size(); ++i) out[i] = bv[(i / static_cast<size_t>(OH * OW)) % static_cast<size_t>(O)];
    for (size_t i = 0; i < gv.size(); ++i) gb[(i / static_cast<size_t>(OH * OW)) % static_cast<size_t>(O)] += gv[i];
    for_each_tap([&](size_t ii, size_t wi, size_t oi) {
      out[oi] += iv[ii] * wv[wi];
      gi[ii] += gv[oi] * wv[wi];
      gw[wi] += gv[oi] * iv[ii];
    });
    Tensor in_gpu = to_device(in, kCuda0), w_gpu = to_device(w, kCuda0), b_gpu = to_device(b, kCuda0);
    Tensor g_gpu = to_device(g, kCuda0);
    for (int repeat = 0; repeat < 2; ++repeat) {  // the second run takes the cached algorithms
      Tensor y = gpu_empty({N, O, OH, OW}, dtype);
      conv2d_forward_kernel(kCuda0)(in_gpu, w_gpu, b_gpu, p, y);
      check_close(y, from_vector<double>(out, {N, O, OH, OW}), 1e-5, 1e-5);
      Tensor grad_in = gpu_empty({N, C, H, W}, dtype), grad_w = gpu_empty({O, Cg, KH, KW}, dtype), grad_b = gpu_empty({O}, dtype);
      conv2d_backward_kernel(kCuda0)(g_gpu, in_gpu, w_gpu, p, grad_in, grad_w, grad_b);
      check_close(grad_in, from_vector<double>(gi, {N, C, H, W}), 1e-5, 1e-5);
      check_close(grad_w, from_vector<double>(gw, {O, Cg, KH, KW}), 1e-5, 1e-5);
      check_close(grad_b, from_vector<double>(gb, {O}), 1e-5, 1e-5);
    }
    // Only the gradients asked for are written.
    Tensor grad_w = gpu_empty({O, Cg, KH, KW}, dtype), none_in, none_b;
    conv2d_backward_kernel(kCuda0)(g_gpu, in_gpu, w_gpu, p, none_in, grad_w, none_b);
    check_close(grad_w, from_vector<double>(gw, {O, Cg, KH, KW}), 1e-5, 1e-5);
  }
  cuda::set_cudnn_allow_tf32(true);
}

TEST_CASE("random numbers on the GPU equal the CPU's for the same generator state" * doctest::skip(!kGpu)) {
  for (DType dtype : {kFloat32, kFloat64}) {
    INFO("dtype ", dtype);
    Generator cpu_gen(77), gpu_gen(77);
    Tensor expected = empty({1000, 33}, dtype), got = gpu_empty({1000, 33}, dtype);
    uniform_kernel(kCpu)(expected, -2.0, 3.0, cpu_gen);
    uniform_kernel(kCuda0)(got, -2.0, 3.0, gpu_gen);
    check_close(got, expected, 0.0);  // bit-identical
    normal_kernel(kCpu)(expected, 0.5, 2.0, cpu_gen);
    normal_kernel(kCuda0)(got, 0.5, 2.0, gpu_gen);
    check_close(got, expected, 1e-12, 1e-12);  // log/cos may differ by an ulp in double
    CHECK(cpu_gen.offset() == gpu_gen.offset());
  }
  Generator cpu_gen(5), gpu_gen(5);
  Tensor expected = empty({4096}, kInt64), got = gpu_empty({4096}, kInt64);
  randint_kernel(kCpu)(expected, -3, 1000003, cpu_gen);
  randint_kernel(kCuda0)(got, -3, 1000003, gpu_gen);
  check_close(got, expected, 0.0);
}

}  // TEST_SUITE
