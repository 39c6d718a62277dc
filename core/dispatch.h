// DispatchStub: one slot per device type for a kernel, as in PyTorch's DispatchStub.
//
// core/ declares each kernel's signature once (core/kernels.h) and the CPU backend
// fills the CPU slot (core/cpu/*.cpp). The CUDA backend fills the CUDA slot from
// cuda/*.cu at load time with LOOM_REGISTER_KERNEL, so core/ never includes a CUDA
// header and every layer above calls kernels without knowing which backend runs them.
//
//   LOOM_DECLARE_KERNEL(relu_kernel, void (*)(const Tensor& in, Tensor& out));  // kernels.h
//   LOOM_DEFINE_KERNEL(relu_kernel);                                             // kernels.cpp
//   LOOM_REGISTER_KERNEL(relu_kernel, DeviceType::CPU, relu_cpu);                // cpu/*.cpp
//   relu_kernel(x.device())(x, out);                                             // caller
//
// Every stub defined with LOOM_DEFINE_KERNEL is also listed in kernel_registry(), so a
// test can ask which kernels a backend lacks (tests/test_cuda.cpp: every kernel with a
// CPU implementation must have a CUDA one in a CUDA build).
#pragma once

#include <type_traits>  // defines: std::is_void_v (a no-op kernel's return)
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "core/shape_only.h"  // defines: shape_only (Note [Shape-only runs])

namespace loom {

namespace detail {
// A kernel of type Fn that does nothing: what shape-only runs call (Note [Shape-only runs]).
template <typename Fn>
struct NoOpKernel;
template <typename R, typename... Args>
struct NoOpKernel<R (*)(Args...)> {
  static R run(Args...) {
    if constexpr (!std::is_void_v<R>) return R{};
  }
};
}  // namespace detail

template <typename Fn>
struct DispatchStub {
  const char* name;
  Fn table[kNumDeviceTypes] = {};
  // A kernel that moves bytes and computes nothing (copy, fill): it runs in shape-only runs
  // too, so that the small tensors that carry metadata keep their values (Note [Shape-only runs]).
  bool moves_bytes_only = false;

  explicit constexpr DispatchStub(const char* op_name) : name(op_name) {}

  Fn operator()(Device device) const {
    Fn fn = table[static_cast<int>(device.type)];
    LOOM_CHECK(fn, "'", name, "' has no kernel for device ", device.str(),
               device.is_cuda() ? ": either this loom was built without CUDA (configure with -Dcuda=enabled) "
                                  "or the CUDA backend does not implement this op yet; run it on the CPU"
                                : ": no backend registered it");
    if (shape_only() && !moves_bytes_only) [[unlikely]] return &detail::NoOpKernel<Fn>::run;  // Note [Shape-only runs]
    return fn;
  }
  void set(DeviceType type, Fn fn) { table[static_cast<int>(type)] = fn; }
  // Whether a backend registered this kernel for `type`.
  bool has(DeviceType type) const { return table[static_cast<int>(type)] != nullptr; }
};

// One defined stub, type-erased: its name and whether a device type has a kernel.
struct KernelListing {
  const char* name;
  const void* stub;
  bool (*has_fn)(const void* stub, DeviceType type);
  bool has(DeviceType type) const { return has_fn(stub, type); }
};

// Every stub defined with LOOM_DEFINE_KERNEL in the loaded program, in static
// initialisation order. (An inline function's static is one object across libloom and
// the executables that include this header.)
inline std::vector<KernelListing>& kernel_registry() {
  static std::vector<KernelListing> listings;
  return listings;
}

namespace detail {
struct KernelRegistrar {
  template <typename Stub, typename Fn>
  KernelRegistrar(Stub& stub, DeviceType type, Fn fn) {
    stub.set(type, fn);
  }
};

struct KernelLister {
  template <typename Stub>
  explicit KernelLister(const Stub& stub) {
    kernel_registry().push_back({stub.name, &stub, [](const void* s, DeviceType type) {
                                   return static_cast<const Stub*>(s)->has(type);
                                 }});
  }
};
}  // namespace detail

}  // namespace loom

#define LOOM_DECLARE_KERNEL(NAME, FN_TYPE) \
  using NAME##_fn = FN_TYPE;               \
  extern ::loom::DispatchStub<NAME##_fn> NAME

// constinit: the stub is filled in by registrars in other translation units during
// static initialisation, so it must itself be initialised before any of them runs.
// The lister (a static initialiser in the defining file) only records the stub's address;
// registrars elsewhere may run before or after it.
#define LOOM_DEFINE_KERNEL(NAME)                                  \
  constinit ::loom::DispatchStub<NAME##_fn> NAME(#NAME);          \
  static ::loom::detail::KernelLister LOOM_CONCAT(NAME##_lister_, __COUNTER__)(NAME)

#define LOOM_CONCAT_INNER(a, b) a##b
#define LOOM_CONCAT(a, b) LOOM_CONCAT_INNER(a, b)
#define LOOM_REGISTER_KERNEL(NAME, DEVICE_TYPE, FN) \
  static ::loom::detail::KernelRegistrar LOOM_CONCAT(NAME##_registrar_, __COUNTER__)(NAME, DEVICE_TYPE, FN)
