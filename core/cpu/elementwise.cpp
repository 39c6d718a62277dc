// CPU pointwise kernels: unary and binary math, comparisons, where, fill, copy.
// All are written with cpu_map (core/cpu/loops.h); see Note [Elementwise loop shapes].
#include <cmath>
#include <cstring>

#include "core/cpu/float32_staging.h"  // defines: float32_copy (Note [16-bit CPU kernels stage through float32])
#include "core/cpu/loops.h"
#include "core/kernels.h"

namespace loom::cpu {
namespace {

void unary_cpu(UnaryOp op, const Tensor& in, Tensor& out) {
  if (is_16bit_float(in.dtype())) {  // See Note [16-bit CPU kernels stage through float32]
    Tensor out32 = float32_like(out);
    unary_cpu(op, float32_copy(in), out32);
    return round_into(out32, out);
  }
  dispatch_floating(in.dtype(), "unary op", [&]<typename T>() {
    switch (op) {
      case UnaryOp::Neg: return cpu_map_typed<T, T>(out, [](T x) { return -x; }, in);
      case UnaryOp::Exp: return cpu_map_typed<T, T>(out, [](T x) { return std::exp(x); }, in);
      case UnaryOp::Log: return cpu_map_typed<T, T>(out, [](T x) { return std::log(x); }, in);
      case UnaryOp::Sqrt: return cpu_map_typed<T, T>(out, [](T x) { return std::sqrt(x); }, in);
      case UnaryOp::Rsqrt: return cpu_map_typed<T, T>(out, [](T x) { return T(1) / std::sqrt(x); }, in);
      case UnaryOp::Abs: return cpu_map_typed<T, T>(out, [](T x) { return std::abs(x); }, in);
      case UnaryOp::Relu: return cpu_map_typed<T, T>(out, [](T x) { return x > T(0) ? x : T(0); }, in);
      case UnaryOp::Sigmoid: return cpu_map_typed<T, T>(out, [](T x) { return T(1) / (T(1) + std::exp(-x)); }, in);
      case UnaryOp::Tanh: return cpu_map_typed<T, T>(out, [](T x) { return std::tanh(x); }, in);
    }
  });
}

template <typename T>
void compare(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  switch (op) {
    case BinaryOp::Eq: return cpu_map_typed<bool, T, T>(out, [](T x, T y) { return x == y; }, a, b);
    case BinaryOp::Ne: return cpu_map_typed<bool, T, T>(out, [](T x, T y) { return x != y; }, a, b);
    case BinaryOp::Lt: return cpu_map_typed<bool, T, T>(out, [](T x, T y) { return x < y; }, a, b);
    case BinaryOp::Le: return cpu_map_typed<bool, T, T>(out, [](T x, T y) { return x <= y; }, a, b);
    case BinaryOp::Gt: return cpu_map_typed<bool, T, T>(out, [](T x, T y) { return x > y; }, a, b);
    case BinaryOp::Ge: return cpu_map_typed<bool, T, T>(out, [](T x, T y) { return x >= y; }, a, b);
    default: LOOM_FAIL("not a comparison");
  }
}

void binary_cpu(BinaryOp op, const Tensor& a, const Tensor& b, double alpha, Tensor& out) {
  if (is_16bit_float(a.dtype())) {  // See Note [16-bit CPU kernels stage through float32]
    Tensor a32 = float32_copy(a), b32 = float32_copy(b);
    if (op >= BinaryOp::Eq) return binary_cpu(op, a32, b32, alpha, out);  // bool out: nothing to round
    Tensor out32 = float32_like(out);
    binary_cpu(op, a32, b32, alpha, out32);
    return round_into(out32, out);
  }
  dispatch_all(a.dtype(), "binary op", [&]<typename T>() {
    if (op >= BinaryOp::Eq) return compare<T>(op, a, b, out);
    if constexpr (std::is_same_v<T, bool>) {
      LOOM_FAIL("arithmetic on bool tensors is not supported; convert with .to(kFloat32) first");
    } else {
      const T s = static_cast<T>(alpha);
      switch (op) {
        case BinaryOp::Add:
          if (alpha == 1.0) return cpu_map_typed<T, T, T>(out, [](T x, T y) { return x + y; }, a, b);
          return cpu_map_typed<T, T, T>(out, [s](T x, T y) { return x + s * y; }, a, b);
        case BinaryOp::Sub:
          if (alpha == 1.0) return cpu_map_typed<T, T, T>(out, [](T x, T y) { return x - y; }, a, b);
          return cpu_map_typed<T, T, T>(out, [s](T x, T y) { return x - s * y; }, a, b);
        case BinaryOp::Mul: return cpu_map_typed<T, T, T>(out, [](T x, T y) { return x * y; }, a, b);
        case BinaryOp::Div: return cpu_map_typed<T, T, T>(out, [](T x, T y) { return x / y; }, a, b);
        // NaN propagates from either side (x != x), as in PyTorch.
        case BinaryOp::Maximum: return cpu_map_typed<T, T, T>(out, [](T x, T y) { return x > y || x != x ? x : y; }, a, b);
        case BinaryOp::Minimum: return cpu_map_typed<T, T, T>(out, [](T x, T y) { return x < y || x != x ? x : y; }, a, b);
        default: LOOM_FAIL("unhandled binary op");
      }
    }
  });
}

void pow_scalar_cpu(const Tensor& in, double exponent, Tensor& out) {
  dispatch_floating(in.dtype(), "pow", [&]<typename T>() {
    const T e = static_cast<T>(exponent);
    if (exponent == 2.0) return cpu_map_typed<T, T>(out, [](T x) { return x * x; }, in);
    cpu_map_typed<T, T>(out, [e](T x) { return std::pow(x, e); }, in);
  });
}

void clamp_cpu(const Tensor& in, double min, double max, Tensor& out) {
  dispatch_all(in.dtype(), "clamp", [&]<typename T>() {
    const T lo = static_cast<T>(min), hi = static_cast<T>(max);
    cpu_map_typed<T, T>(out, [lo, hi](T x) { return x < lo ? lo : (x > hi ? hi : x); }, in);
  });
}

void where_cpu(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out) {
  dispatch_all(a.dtype(), "where", [&]<typename T>() {
    cpu_map_typed<T, bool, T, T>(out, [](bool c, T x, T y) { return c ? x : y; }, cond, a, b);
  });
}

void threshold_backward_cpu(const Tensor& grad_out, const Tensor& ref, double threshold, Tensor& grad_in) {
  if (is_16bit_float(grad_out.dtype())) {  // relu's gradient under autocast: Note [16-bit CPU kernels stage through float32]
    Tensor grad_in32 = float32_like(grad_in);
    threshold_backward_cpu(float32_copy(grad_out), float32_copy(ref), threshold, grad_in32);
    return round_into(grad_in32, grad_in);
  }
  dispatch_floating(grad_out.dtype(), "threshold_backward", [&]<typename T>() {
    const T t = static_cast<T>(threshold);
    cpu_map_typed<T, T, T>(grad_in, [t](T g, T r) { return r > t ? g : T(0); }, grad_out, ref);
  });
}

void fill_cpu(Tensor& self, double value) {
  dispatch_any(self.dtype(), "fill_", [&]<typename T>() {  // 16-bit floats too: zeros(), ones(), full()
    T v;
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) v = T(static_cast<float>(value));
    else v = static_cast<T>(value);
    if (self.is_contiguous()) {
      T* p = self.data_ptr<T>();
      const int64_t n = self.numel();
#pragma omp parallel for simd schedule(static) if (n > kGrain)
      for (int64_t i = 0; i < n; ++i) p[i] = v;
      return;
    }
    cpu_map_typed<T, T>(self, [v](T) { return v; }, self);
  });
}

// 16-bit floats are storage types on CPU: they are converted through float.
template <typename T> struct Widen { using type = T; };
template <> struct Widen<Half> { using type = float; };
template <> struct Widen<BFloat16> { using type = float; };

void copy_cpu(const Tensor& src, Tensor& dst, bool) {
  LOOM_CHECK(src.device().is_cpu() && dst.device().is_cpu(), "CPU copy got ", src.device(), " -> ", dst.device());
  if (src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous()) {
    // The common case (moves between virtual devices, clone, contiguous()): a memcpy,
    // split across threads for large tensors.
    const char* from = static_cast<const char*>(src.raw_data());
    char* to = static_cast<char*>(dst.raw_data());
    const int64_t bytes = static_cast<int64_t>(src.nbytes());
    const int64_t chunk = 1 << 20;
    const int64_t chunks = (bytes + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (int64_t c = 0; c < chunks; ++c)
      std::memcpy(to + c * chunk, from + c * chunk, static_cast<size_t>(std::min(chunk, bytes - c * chunk)));
    return;
  }
  dispatch_any(src.dtype(), "copy", [&]<typename Src>() {
    dispatch_any(dst.dtype(), "copy", [&]<typename Dst>() {
      using Wide = typename Widen<Src>::type;
      cpu_map_typed<Dst, Src>(dst, [](Src x) { return static_cast<Dst>(static_cast<Wide>(x)); }, src);
    });
  });
}

}  // namespace

LOOM_REGISTER_KERNEL(unary_kernel, DeviceType::CPU, unary_cpu);
LOOM_REGISTER_KERNEL(binary_kernel, DeviceType::CPU, binary_cpu);
LOOM_REGISTER_KERNEL(pow_scalar_kernel, DeviceType::CPU, pow_scalar_cpu);
LOOM_REGISTER_KERNEL(clamp_kernel, DeviceType::CPU, clamp_cpu);
LOOM_REGISTER_KERNEL(where_kernel, DeviceType::CPU, where_cpu);
LOOM_REGISTER_KERNEL(threshold_backward_kernel, DeviceType::CPU, threshold_backward_cpu);
LOOM_REGISTER_KERNEL(fill_kernel, DeviceType::CPU, fill_cpu);
LOOM_REGISTER_KERNEL(copy_kernel, DeviceType::CPU, copy_cpu);

}  // namespace loom::cpu
