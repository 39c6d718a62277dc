// Autocast state, policy and casting; see autograd/autocast.h.
#include "autograd/autocast.h"

#include <array>
#include <map>
#include <tuple>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "core/error.h"

namespace loom::autocast {
namespace {

struct DeviceState {
  bool enabled = false;
  DType dtype;
};

struct CacheEntry {
  Tensor source;  // keeps the key's TensorImpl alive, so its address is not reused
  Tensor cast;
  uint32_t version;
};

// Key: (source tensor, target dtype, grad mode). See Note [Weight cast cache].
using CacheKey = std::tuple<const TensorImpl*, DType, bool>;

// See Note [Autocast state is per thread].
struct ThreadState {
  std::array<DeviceState, kNumDeviceTypes> devices{DeviceState{false, kBFloat16}, DeviceState{false, kFloat16}};
  bool cache_enabled = true;
  int nesting = 0;  // open Guards, enabled or not; the cache is cleared when it returns to 0
  std::map<CacheKey, CacheEntry> cache;
};

thread_local ThreadState t_state;

DeviceState& state_of(DeviceType device) { return t_state.devices[static_cast<int>(device)]; }

bool eligible(const Tensor& t, DType dtype, DeviceType device) {
  return t.defined() && is_floating(t.dtype()) && t.dtype() != kFloat64 && t.dtype() != dtype &&
         t.device().type == device;
}

}  // namespace

bool is_enabled(DeviceType device) { return state_of(device).enabled; }
DType get_dtype(DeviceType device) { return state_of(device).dtype; }

bool any_enabled() {
  for (const DeviceState& s : t_state.devices)
    if (s.enabled) return true;
  return false;
}

Guard::Guard(DeviceType device, std::optional<DType> dtype, bool enabled, bool cache_enabled)
    : device_(device),
      prev_enabled_(state_of(device).enabled),
      prev_dtype_(state_of(device).dtype),
      prev_cache_enabled_(t_state.cache_enabled) {
  if (dtype) {
    LOOM_CHECK(*dtype == kFloat16 || *dtype == kBFloat16, "autocast: expected dtype float16 or bfloat16 for ",
               device_type_name(device), ", got ", dtype_name(*dtype),
               "; autocast lowers float32 ops to a 16-bit type (use enabled=false for a float32 region)");
  }
  DeviceState& s = state_of(device);
  s.enabled = enabled;
  if (dtype) s.dtype = *dtype;
  t_state.cache_enabled = cache_enabled;
  ++t_state.nesting;
}

Guard::~Guard() {
  DeviceState& s = state_of(device_);
  s.enabled = prev_enabled_;
  s.dtype = prev_dtype_;
  t_state.cache_enabled = prev_cache_enabled_;
  if (--t_state.nesting == 0) t_state.cache.clear();  // See Note [Weight cast cache]
}

DisableGuard::DisableGuard() : prev_cpu_(state_of(DeviceType::CPU).enabled), prev_cuda_(state_of(DeviceType::CUDA).enabled) {
  state_of(DeviceType::CPU).enabled = false;
  state_of(DeviceType::CUDA).enabled = false;
}

DisableGuard::~DisableGuard() {
  state_of(DeviceType::CPU).enabled = prev_cpu_;
  state_of(DeviceType::CUDA).enabled = prev_cuda_;
}

// See Note [Autocast op lists per device]. Ops on neither list of a device run in the
// dtype that arrives (CastPolicy::None).
CastPolicy policy_of(std::string_view op, DeviceType device) {
  using P = CastPolicy;
  static const std::map<std::string_view, CastPolicy> cuda = {
      {"conv2d", P::LowerPrecision}, {"mm", P::LowerPrecision},       {"bmm", P::LowerPrecision},
      {"matmul", P::LowerPrecision}, {"linear", P::LowerPrecision},   {"batch_norm", P::Float32},
      {"batch_norm_relu", P::Float32}, {"sync_batch_norm", P::Float32}, {"log_softmax", P::Float32},
      {"softmax", P::Float32},       {"nll_loss", P::Float32},        {"cross_entropy", P::Float32},
      {"sum", P::Float32},           {"mean", P::Float32},            {"var", P::Float32},
  };
  static const std::map<std::string_view, CastPolicy> cpu = {
      {"conv2d", P::LowerPrecision}, {"mm", P::LowerPrecision},       {"bmm", P::LowerPrecision},
      {"matmul", P::LowerPrecision}, {"linear", P::LowerPrecision},   {"sync_batch_norm", P::Float32},
      {"log_softmax", P::Float32},   {"softmax", P::Float32},         {"nll_loss", P::Float32},
      {"cross_entropy", P::Float32},
  };
  const auto& policies = device == DeviceType::CPU ? cpu : cuda;
  auto it = policies.find(op);
  return it == policies.end() ? CastPolicy::None : it->second;
}

std::optional<DType> target_dtype(CastPolicy policy, DeviceType device) {
  if (!is_enabled(device)) return std::nullopt;
  switch (policy) {
    case CastPolicy::LowerPrecision: return get_dtype(device);
    case CastPolicy::Float32: return kFloat32;
    case CastPolicy::None: return std::nullopt;
  }
  return std::nullopt;
}

Tensor cast(const Tensor& t, DType dtype, DeviceType device) {
  if (!eligible(t, dtype, device)) return t;
  // Only leaves that require grad (parameters) are worth caching: see Note [Weight cast cache].
  const bool cacheable = t_state.cache_enabled && t.requires_grad() && t.is_leaf();
  if (!cacheable) return to(t, dtype);
  const CacheKey key{t.unsafe_impl(), dtype, GradMode::is_enabled()};
  auto it = t_state.cache.find(key);
  if (it != t_state.cache.end() && it->second.version == t.version()) return it->second.cast;
  Tensor out = to(t, dtype);
  t_state.cache[key] = CacheEntry{t, out, t.version()};
  return out;
}

bool apply(std::string_view op, std::initializer_list<Tensor*> tensors) {
  const Tensor* first = nullptr;
  for (Tensor* t : tensors)
    if (t->defined()) {
      first = t;
      break;
    }
  if (first == nullptr) return false;
  const DeviceType device = first->device().type;
  const std::optional<DType> dtype = target_dtype(policy_of(op, device), device);
  if (!dtype) return false;
  bool changed = false;
  for (Tensor* t : tensors) {
    Tensor cast_t = cast(*t, *dtype, device);
    if (cast_t.unsafe_impl() != t->unsafe_impl()) {
      *t = cast_t;
      changed = true;
    }
  }
  return changed;
}

size_t cache_size() { return t_state.cache.size(); }

}  // namespace loom::autocast
