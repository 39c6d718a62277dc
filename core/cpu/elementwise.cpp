// CPU pointwise kernels: unary and binary math, comparisons, where, fill, copy.
// All are written with cpu_map (core/cpu/loops.h); see Note [Elementwise loop shapes].
// The math kernels run on 16-bit floats directly (Note [bfloat16 conversion in
// registers]), computing in float.
#include <cmath>
#include <cstring>

#include "core/cpu/bf16_convert.h"  // defines: widen, narrow, dispatch_floating_16bit
#include "core/cpu/loops.h"
#include "core/kernels.h"

namespace loom::cpu {
namespace {

void unary_cpu(UnaryOp op, const Tensor& in, Tensor& out) {
  // 16-bit floats natively: Note [bfloat16 conversion in registers].
  dispatch_floating_16bit(in.dtype(), "unary op", [&]<typename T>() {
    using C = compute_t<T>;
    auto map = [&](auto f) { cpu_map_typed<T, T>(out, [f](T x) { return narrow<T>(f(widen(x))); }, in); };
    switch (op) {
      case UnaryOp::Neg: return map([](C x) { return -x; });
      case UnaryOp::Exp: return map([](C x) { return std::exp(x); });
      case UnaryOp::Log: return map([](C x) { return std::log(x); });
      case UnaryOp::Sqrt: return map([](C x) { return std::sqrt(x); });
      case UnaryOp::Rsqrt: return map([](C x) { return C(1) / std::sqrt(x); });
      case UnaryOp::Abs: return map([](C x) { return std::abs(x); });
      case UnaryOp::Relu: return map([](C x) { return x > C(0) ? x : C(0); });
      case UnaryOp::Sigmoid: return map([](C x) { return C(1) / (C(1) + std::exp(-x)); });
      case UnaryOp::Tanh: return map([](C x) { return std::tanh(x); });
    }
  });
}

template <typename T>
void compare(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  auto map = [&](auto f) { cpu_map_typed<bool, T, T>(out, [f](T x, T y) { return f(widen(x), widen(y)); }, a, b); };
  using C = compute_t<T>;
  switch (op) {
    case BinaryOp::Eq: return map([](C x, C y) { return x == y; });
    case BinaryOp::Ne: return map([](C x, C y) { return x != y; });
    case BinaryOp::Lt: return map([](C x, C y) { return x < y; });
    case BinaryOp::Le: return map([](C x, C y) { return x <= y; });
    case BinaryOp::Gt: return map([](C x, C y) { return x > y; });
    case BinaryOp::Ge: return map([](C x, C y) { return x >= y; });
    default: LOOM_FAIL("not a comparison");
  }
}

// a (op) b elementwise in compute_t<T>, rounded to T once (bfloat16: Note [bfloat16
// conversion in registers]; the engine accumulates gradients through Add).
template <typename T>
void arithmetic(BinaryOp op, const Tensor& a, const Tensor& b, double alpha, Tensor& out) {
  using C = compute_t<T>;
  auto map = [&](auto f) { cpu_map_typed<T, T, T>(out, [f](T x, T y) { return narrow<T>(f(widen(x), widen(y))); }, a, b); };
  const C s = static_cast<C>(alpha);
  switch (op) {
    case BinaryOp::Add:
      if (alpha == 1.0) return map([](C x, C y) { return x + y; });
      return map([s](C x, C y) { return x + s * y; });
    case BinaryOp::Sub:
      if (alpha == 1.0) return map([](C x, C y) { return x - y; });
      return map([s](C x, C y) { return x - s * y; });
    case BinaryOp::Mul: return map([](C x, C y) { return x * y; });
    case BinaryOp::Div: return map([](C x, C y) { return x / y; });
    // NaN propagates from either side (x != x), as in PyTorch.
    case BinaryOp::Maximum: return map([](C x, C y) { return x > y || x != x ? x : y; });
    case BinaryOp::Minimum: return map([](C x, C y) { return x < y || x != x ? x : y; });
    default: LOOM_FAIL("unhandled binary op");
  }
}

void binary_cpu(BinaryOp op, const Tensor& a, const Tensor& b, double alpha, Tensor& out) {
  auto typed = [&]<typename T>() {
    if (op >= BinaryOp::Eq) return compare<T>(op, a, b, out);
    if constexpr (std::is_same_v<T, bool>) {
      LOOM_FAIL("arithmetic on bool tensors is not supported; convert with .to(kFloat32) first");
    } else {
      arithmetic<T>(op, a, b, alpha, out);
    }
  };
  if (a.dtype() == kBFloat16) return typed.template operator()<BFloat16>();
  if (a.dtype() == kFloat16) return typed.template operator()<Half>();
  dispatch_all(a.dtype(), "binary op", typed);
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
  dispatch_floating_16bit(grad_out.dtype(), "threshold_backward", [&]<typename T>() {
    const compute_t<T> t = static_cast<compute_t<T>>(threshold);
    // The kept gradient is passed through bit for bit; T() is +0 for every T.
    cpu_map_typed<T, T, T>(grad_in, [t](T g, T r) { return widen(r) > t ? g : T(); }, grad_out, ref);
  });
}

void fill_cpu(Tensor& self, double value) {
  dispatch_any(self.dtype(), "fill_", [&]<typename T>() {  // 16-bit floats too: zeros(), ones(), full()
    const T v = narrow<T>(value);
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
      // 16-bit floats convert through float (Note [bfloat16 conversion in registers]):
      // autocast's casts and the gradients they send back to float32 parameters.
      cpu_map_typed<Dst, Src>(dst, [](Src x) { return narrow<Dst>(widen(x)); }, src);
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
