// CUDA pointwise kernels: unary and binary math, comparisons, pow, clamp, where,
// threshold_backward (ReLU's backward) and fill, mirroring core/cpu/elementwise.cpp.
// All are gpu_map calls; see Note [GPU elementwise loop] for why each functor takes a
// runtime op code and which dtypes each op instantiates.
#include "core/kernels.h"
#include "cuda/loops.cuh"  // defines: gpu_map, dispatch_types, widen, narrow

namespace loom::cuda {
namespace {

// Overloads so functors read the same for float and double compute types.
__device__ inline float d_exp(float x) { return expf(x); }
__device__ inline double d_exp(double x) { return exp(x); }
__device__ inline float d_log(float x) { return logf(x); }
__device__ inline double d_log(double x) { return log(x); }
__device__ inline float d_sqrt(float x) { return sqrtf(x); }
__device__ inline double d_sqrt(double x) { return sqrt(x); }
__device__ inline float d_tanh(float x) { return tanhf(x); }
__device__ inline double d_tanh(double x) { return tanh(x); }
__device__ inline float d_pow(float x, float e) { return powf(x, e); }
__device__ inline double d_pow(double x, double e) { return pow(x, e); }

template <typename T>
struct UnaryFn {
  UnaryOp op;
  __device__ T operator()(T in) const {
    using C = compute_t<T>;
    const C x = widen(in);
    C y = x;
    switch (op) {
      case UnaryOp::Neg: y = -x; break;
      case UnaryOp::Exp: y = d_exp(x); break;
      case UnaryOp::Log: y = d_log(x); break;
      case UnaryOp::Sqrt: y = d_sqrt(x); break;
      case UnaryOp::Rsqrt: y = C(1) / d_sqrt(x); break;
      case UnaryOp::Abs: y = x < C(0) ? -x : x; break;
      case UnaryOp::Relu: y = x > C(0) ? x : C(0); break;
      case UnaryOp::Sigmoid: y = C(1) / (C(1) + d_exp(-x)); break;
      case UnaryOp::Tanh: y = d_tanh(x); break;
    }
    return narrow<T>(y);
  }
};

void unary_cuda(UnaryOp op, const Tensor& in, Tensor& out) {
  dispatch_types(FloatAndHalfTypes{}, in.dtype(), "unary op", [&]<typename T>() {
    gpu_map<T, T>(out, UnaryFn<T>{op}, in);
  });
}

template <typename T>
struct ArithmeticFn {
  BinaryOp op;
  compute_t<T> alpha;
  __device__ T operator()(T a, T b) const {
    const compute_t<T> x = widen(a), y = widen(b);
    switch (op) {
      case BinaryOp::Add: return narrow<T>(x + alpha * y);
      case BinaryOp::Sub: return narrow<T>(x - alpha * y);
      case BinaryOp::Mul: return narrow<T>(x * y);
      case BinaryOp::Div: return narrow<T>(x / y);
      case BinaryOp::Maximum: return narrow<T>(x > y || x != x ? x : y);  // NaN propagates, as on the CPU
      default: return narrow<T>(x < y || x != x ? x : y);                 // Minimum
    }
  }
};

template <typename T>
struct CompareFn {
  BinaryOp op;
  __device__ bool operator()(T a, T b) const {
    const compute_t<T> x = widen(a), y = widen(b);
    switch (op) {
      case BinaryOp::Eq: return x == y;
      case BinaryOp::Ne: return x != y;
      case BinaryOp::Lt: return x < y;
      case BinaryOp::Le: return x <= y;
      case BinaryOp::Gt: return x > y;
      default: return x >= y;  // Ge
    }
  }
};

void binary_cuda(BinaryOp op, const Tensor& a, const Tensor& b, double alpha, Tensor& out) {
  if (op >= BinaryOp::Eq) {
    dispatch_types(NumberTypes{}, a.dtype(), "comparison", [&]<typename T>() {
      gpu_map<bool, T, T>(out, CompareFn<T>{op}, a, b);
    });
    return;
  }
  dispatch_types(TypeList<float, double, int64_t, __half, __nv_bfloat16>{}, a.dtype(), "binary op", [&]<typename T>() {
    // As on the CPU, alpha is first converted to the tensor's type (Add/Sub only).
    const T alpha_t = narrow<T>(alpha);
    gpu_map<T, T, T>(out, ArithmeticFn<T>{op, widen(alpha_t)}, a, b);
  });
}

template <typename T>
struct PowFn {
  T exponent;
  __device__ T operator()(T x) const { return exponent == T(2) ? x * x : d_pow(x, exponent); }
};

void pow_scalar_cuda(const Tensor& in, double exponent, Tensor& out) {
  dispatch_types(FloatTypes{}, in.dtype(), "pow", [&]<typename T>() {
    gpu_map<T, T>(out, PowFn<T>{static_cast<T>(exponent)}, in);
  });
}

template <typename T>
struct ClampFn {
  T lo, hi;
  __device__ T operator()(T x) const { return x < lo ? lo : (x > hi ? hi : x); }
};

void clamp_cuda(const Tensor& in, double min, double max, Tensor& out) {
  dispatch_types(NumberTypes{}, in.dtype(), "clamp", [&]<typename T>() {
    gpu_map<T, T>(out, ClampFn<T>{static_cast<T>(min), static_cast<T>(max)}, in);
  });
}

template <typename T>
struct WhereFn {
  __device__ T operator()(bool c, T x, T y) const { return c ? x : y; }
};

void where_cuda(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out) {
  LOOM_CHECK(cond.dtype() == kBool, "where: the condition must be bool, got ", cond.dtype());
  dispatch_types(NumberTypes{}, a.dtype(), "where", [&]<typename T>() {
    gpu_map<T, bool, T, T>(out, WhereFn<T>{}, cond, a, b);
  });
}

template <typename T>
struct ThresholdBackwardFn {
  compute_t<T> threshold;
  __device__ T operator()(T grad, T ref) const { return widen(ref) > threshold ? grad : narrow<T>(0.0f); }
};

void threshold_backward_cuda(const Tensor& grad_out, const Tensor& ref, double threshold, Tensor& grad_in) {
  dispatch_types(FloatAndHalfTypes{}, grad_out.dtype(), "threshold_backward", [&]<typename T>() {
    const T t = narrow<T>(threshold);
    gpu_map<T, T, T>(grad_in, ThresholdBackwardFn<T>{widen(t)}, grad_out, ref);
  });
}

template <typename T>
struct FillFn {
  T value;
  __device__ T operator()() const { return value; }
};

void fill_cuda(Tensor& self, double value) {
  dispatch_types(AllTypes{}, self.dtype(), "fill_", [&]<typename T>() {
    gpu_map<T>(self, FillFn<T>{narrow<T>(value)});
  });
}

}  // namespace

LOOM_REGISTER_KERNEL(unary_kernel, DeviceType::CUDA, unary_cuda);
LOOM_REGISTER_KERNEL(binary_kernel, DeviceType::CUDA, binary_cuda);
LOOM_REGISTER_KERNEL(pow_scalar_kernel, DeviceType::CUDA, pow_scalar_cuda);
LOOM_REGISTER_KERNEL(clamp_kernel, DeviceType::CUDA, clamp_cuda);
LOOM_REGISTER_KERNEL(where_kernel, DeviceType::CUDA, where_cuda);
LOOM_REGISTER_KERNEL(threshold_backward_kernel, DeviceType::CUDA, threshold_backward_cuda);
LOOM_REGISTER_KERNEL(fill_kernel, DeviceType::CUDA, fill_cuda);

}  // namespace loom::cuda
