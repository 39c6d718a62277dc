// Autocast: mixed precision by op, as torch.autocast.
//
//   {
//     autocast::Guard guard(DeviceType::CUDA, kBFloat16);
//     Tensor loss = criterion(model->forward(x), y);  // convs and matmuls in bfloat16,
//   }                                                 // batch norm and the loss in float32
//   loss.backward();                                  // float32 gradients on float32 parameters
//
// Inside a scope, the op entry points of autograd/ops look up their cast policy
// (policy_of, per device type: Note [Autocast op lists per device]) and cast their
// floating-point inputs before running:
//   - LowerPrecision (conv2d, mm, bmm, matmul, linear): inputs go to the scope's 16-bit
//     dtype. The kernels accumulate in float32 (cuBLAS/cuDNN compute types; oneDNN or
//     float32 staging on the CPU, Note [16-bit CPU kernels stage through float32]).
//   - Float32: 16-bit inputs go to float32, because their sums and exponentials lose too
//     much in 16 bits (losses and softmax on both devices; more on CUDA, below).
//   - every other op runs in whatever dtype arrives (relu, add, pooling, views; on the
//     CPU batch norm and the reductions too).
// float64 tensors are never cast, and only tensors on the scope's device type are.
//
// The casts are the differentiable to(dtype), so backward brings each gradient back
// to its source's dtype: float32 parameters get float32 gradients. Call backward
// outside the scope, as PyTorch recommends; the engine turns autocast off while it
// runs anyway (Note [No autocast in backward]).
//
// Note [Autocast op lists per device]
// As PyTorch, each device type has its own lists (autocast_mode.cpp's AutocastCUDA and
// AutocastCPU), restricted to the ops loom has:
//   CUDA  LowerPrecision  conv2d mm bmm matmul linear
//         Float32         batch_norm batch_norm_relu log_softmax softmax nll_loss
//                         cross_entropy sum mean var
//   CPU   LowerPrecision  conv2d mm bmm matmul linear
//         Float32         nll_loss cross_entropy log_softmax softmax
// CUDA batch norm runs in float32 because loom's CUDA kernels need input and parameters
// of one dtype (the cost: one cast of each conv output). On the CPU batch norm is on no
// list, as in PyTorch: a bfloat16 conv output goes in as it is and meets the float32
// weight and running statistics in the mixed kernel (Note [Mixed-precision batch norm
// on the CPU], core/cpu/batch_norm.cpp), which saves a cast pass and half the bytes of
// every later elementwise op. sum/mean/var are not on PyTorch's CPU lists either: they
// run in bfloat16 with float32 accumulation. log_softmax/softmax are loom's addition to
// the CPU float32 list (PyTorch's CPU runs them in bfloat16): loom's softmax kernels have
// no 16-bit path, and in training they sit inside cross_entropy, which is float32 anyway.
// sync_batch_norm (SyncBatchNorm's statistics, nn/batchnorm.cpp) is float32 on both.
//
// Note [Autocast at op entry]
// Each listed op starts with
//   if (autocast::any_enabled()) {
//     Tensor ca = a, cb = b;
//     if (autocast::apply("mm", {&ca, &cb})) return mm(ca, cb);
//   }
// i.e. it casts and calls itself again. In the second call every input already has the
// target dtype, apply() casts nothing and returns false, and the op runs as usual; so
// casting lives in one place and the op bodies stay dtype-agnostic. Composite ops
// (matmul -> mm, linear on N-D input -> linear on 2-D, cross_entropy -> log_softmax)
// cast once at the outer entry; the inner entries find nothing left to cast.
// Cost outside autocast: one thread-local read per op.
//
// Note [No autocast in backward]
// Backward formulas call ops too (mm for mm's gradient, sum for a broadcast's). They
// must run in the dtypes the forward recorded -- a gradient has its tensor's dtype --
// not be re-cast by a scope the caller happens to be in, so the engine disables
// autocast on its thread while it runs (autocast::DisableGuard). PyTorch gets the same
// by running backward outside the autocast dispatch keys.
//
// Note [Autocast state is per thread]
// Enabled flag, dtype, nesting depth and the weight cast cache are thread_local, as
// PyTorch's: one thread's scope never changes the ops of another (DP replica threads,
// pipeline stages). A thread that should run under autocast opens its own scope.
//
// Note [Weight cast cache]
// A parameter used by several ops in one scope (or one module applied twice) would be
// cast again each time. The first cast of a leaf that requires grad is kept, keyed by
// the tensor, its version (an in-place update invalidates the entry) and grad mode (a
// cast made under no_grad has no graph back to the parameter, so it must not serve an
// op recorded with grad). The cache is cleared when the thread's outermost scope closes
// (as PyTorch's autocast nesting count), so each training step casts the updated
// weights afresh. Activations
// are not cached: they are new tensors every step.
#pragma once

#include <initializer_list>
#include <optional>
#include <string_view>

#include "core/device.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace loom::autocast {

// ---- state (thread-local; see Note [Autocast state is per thread]) -----------------
bool is_enabled(DeviceType device);
// The 16-bit dtype used on `device` when enabled. Defaults: float16 on CUDA, bfloat16
// on CPU (PyTorch's).
DType get_dtype(DeviceType device);
// Enabled on some device type: the fast check every op entry makes first.
bool any_enabled();

// RAII scope, torch.autocast(device_type, dtype, enabled, cache_enabled). Nestable: the
// destructor restores what the enclosing scope had. `enabled = false` opens a scope
// with autocast off (a float32 region inside an autocast one). dtype must be float16 or
// bfloat16; std::nullopt keeps the current one for the device.
class Guard {
 public:
  explicit Guard(DeviceType device, std::optional<DType> dtype = std::nullopt, bool enabled = true,
                 bool cache_enabled = true);
  ~Guard();
  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;

 private:
  DeviceType device_;
  bool prev_enabled_;
  DType prev_dtype_;
  bool prev_cache_enabled_;
};

// ---- policy (pure; tested without tensors) ------------------------------------------
enum class CastPolicy { LowerPrecision, Float32, None };
// The policy of an op by its PyTorch name ("conv2d", "log_softmax", ...) on a device
// type: Note [Autocast op lists per device].
CastPolicy policy_of(std::string_view op, DeviceType device);

// ---- what op entry points call --------------------------------------------------------
// The dtype `policy` casts eligible tensors on `device` to, or nullopt when autocast is
// off there or the policy casts nothing.
std::optional<DType> target_dtype(CastPolicy policy, DeviceType device);
// `t` cast to `dtype` if it is eligible (defined, floating, not float64, on `device`,
// of another dtype), else `t` itself. Parameters go through the weight cast cache.
Tensor cast(const Tensor& t, DType dtype, DeviceType device);

// Casts `tensors` in place for op `op`, when autocast is on for their device (that of
// the first defined one). Returns true when it cast something. The common entry:
//   if (autocast::any_enabled()) autocast::apply("mm", {&a2, &b2});
bool apply(std::string_view op, std::initializer_list<Tensor*> tensors);

// ---- introspection for tests and docs --------------------------------------------------
// Entries in this thread's weight cast cache.
size_t cache_size();
// Turns autocast off on every device for the current thread within the scope; the
// engine holds one while running backward (Note [No autocast in backward]).
class DisableGuard {
 public:
  DisableGuard();
  ~DisableGuard();
  DisableGuard(const DisableGuard&) = delete;
  DisableGuard& operator=(const DisableGuard&) = delete;

 private:
  bool prev_cpu_, prev_cuda_;
};

}  // namespace loom::autocast
