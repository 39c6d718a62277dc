// Tensor: a typed, shaped view of a Storage on a Device, plus autograd metadata.
//
//   Tensor x = loom::randn({4, 3}, loom::TensorOptions().requires_grad(true));
//   Tensor y = (x * 2).relu().sum();
//   y.backward();                      // x.grad() now holds dy/dx
//
// A Tensor is a cheap handle (a shared_ptr): copying it aliases the same tensor, as
// in PyTorch's C++ API. Views (reshape of contiguous data, transpose, narrow, select,
// expand, ...) share storage and differ only in shape, strides and offset.
//
// Sharp edge: a Tensor's math methods (add, sum, relu, ...) are the differentiable
// ops of autograd/ops.h; they are declared here for PyTorch-like spelling and defined
// in autograd/tensor_methods.cpp. core/ itself never records a graph.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/memory_format.h"  // defines: MemoryFormat (Note [Channels-last activations])
#include "core/shape.h"
#include "core/storage.h"

namespace loom {

struct AutogradMeta;  // autograd/variable.h
class Node;           // autograd/node.h
class Tensor;

// What a factory makes: dtype, device and whether the result is a leaf requiring grad.
// Builds like PyTorch's: TensorOptions().dtype(kFloat64).device("cpu:1").
struct TensorOptions {
  DType dtype_ = kFloat32;
  Device device_;
  bool requires_grad_ = false;

  TensorOptions() = default;
  TensorOptions(DType dtype) : dtype_(dtype) {}     // NOLINT: implicit, as in PyTorch
  TensorOptions(Device device) : device_(device) {}  // NOLINT
  TensorOptions(const char* device) : device_(device) {}  // NOLINT
  TensorOptions dtype(DType d) const { auto o = *this; o.dtype_ = d; return o; }
  TensorOptions device(Device d) const { auto o = *this; o.device_ = d; return o; }
  TensorOptions requires_grad(bool r = true) const { auto o = *this; o.requires_grad_ = r; return o; }
};

class TensorImpl {
 public:
  TensorImpl(Storage storage, Shape shape, Shape strides, int64_t offset, DType dtype);

  Storage storage;
  Shape shape;
  Shape strides;
  int64_t offset = 0;  // in elements
  DType dtype;
  std::shared_ptr<AutogradMeta> autograd;  // null for tensors that never needed grad
};

class Tensor {
 public:
  Tensor() = default;  // undefined: defined() is false
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- metadata -------------------------------------------------------------------
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl().shape; }
  const Shape& sizes() const { return impl().shape; }
  int64_t size(int64_t dim) const;
  const Shape& strides() const { return impl().strides; }
  int64_t stride(int64_t dim) const;
  int64_t dim() const { return static_cast<int64_t>(impl().shape.size()); }
  int64_t numel() const { return loom::numel(impl().shape); }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage->device(); }
  int64_t storage_offset() const { return impl().offset; }
  size_t element_size() const { return loom::element_size(dtype()); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * element_size(); }
  bool is_contiguous() const;  // NCHW-contiguous for 4-D tensors (MemoryFormat::Contiguous)
  bool is_contiguous(MemoryFormat format) const;
  // ChannelsLast when the strides can only mean NHWC, else Contiguous (core/memory_format.h).
  MemoryFormat suggest_memory_format() const;
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }
  const Storage& storage() const { return impl().storage; }
  TensorImpl* unsafe_impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  std::string str() const;  // "Tensor[float32, [2, 3], cpu:0]"

  // Raw data (with the view's offset applied). The CPU path checks T matches dtype.
  void* raw_data() const;
  template <typename T> T* data_ptr() const {
    LOOM_CHECK(dtype_of<T>() == dtype(), "data_ptr: tensor has dtype ", dtype(),
               " but was asked for ", dtype_of<T>());
    return static_cast<T*>(raw_data());
  }
  // The single value of a one-element tensor, copied to the host.
  template <typename T> T item() const;
  // All values, contiguous, copied to the host (for tests and printing).
  template <typename T> std::vector<T> tolist() const;

  // ---- autograd (autograd/variable.cpp) --------------------------------------------
  bool requires_grad() const;
  Tensor& requires_grad_(bool requires_grad = true);
  bool is_leaf() const;
  Tensor grad() const;             // undefined until backward reaches this leaf
  void set_grad(const Tensor& grad) const;
  std::shared_ptr<Node> grad_fn() const;
  uint32_t version() const { return impl().storage->version(); }
  void bump_version() const { impl().storage->bump_version(); }
  // backward(): this must be a one-element tensor; otherwise pass grad (same shape).
  void backward(const Tensor& grad = Tensor(), bool retain_graph = false) const;
  Tensor detach() const;           // same storage, no history, requires_grad false
  // Hook on the gradient flowing into this tensor; may return a replacement gradient
  // (or an undefined Tensor to keep it).
  void register_hook(std::function<Tensor(const Tensor&)> hook) const;
  // Leaves only: called after the gradient has been accumulated into grad().
  void register_post_accumulate_grad_hook(std::function<void(const Tensor&)> hook) const;

  // ---- views and movement (autograd/tensor_methods.cpp) --------------------------
  Tensor view(const Shape& shape) const;
  Tensor reshape(const Shape& shape) const;
  Tensor permute(const Shape& dims) const;
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor t() const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor expand(const Shape& shape) const;
  Tensor squeeze() const;
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor contiguous() const;
  Tensor contiguous(MemoryFormat format) const;  // Note [Channels-last activations]
  Tensor clone() const;
  Tensor to(Device device, bool non_blocking = false) const;
  Tensor to(DType dtype) const;
  Tensor& copy_(const Tensor& src, bool non_blocking = false);
  std::vector<Tensor> split(int64_t split_size, int64_t dim = 0) const;
  std::vector<Tensor> chunk(int64_t chunks, int64_t dim = 0) const;
  Tensor index_select(int64_t dim, const Tensor& index) const;
  Tensor gather(int64_t dim, const Tensor& index) const;

  // ---- math ------------------------------------------------------------------------
  Tensor add(const Tensor& other, double alpha = 1.0) const;
  Tensor sub(const Tensor& other, double alpha = 1.0) const;
  Tensor mul(const Tensor& other) const;
  Tensor div(const Tensor& other) const;
  Tensor neg() const;
  Tensor exp() const;
  Tensor log() const;
  Tensor sqrt() const;
  Tensor rsqrt() const;
  Tensor pow(double exponent) const;
  Tensor abs() const;
  Tensor clamp(double min, double max) const;
  Tensor relu() const;
  Tensor sigmoid() const;
  Tensor tanh() const;
  Tensor matmul(const Tensor& other) const;

  Tensor sum() const;
  Tensor sum(const Shape& dims, bool keepdim = false) const;
  Tensor mean() const;
  Tensor mean(const Shape& dims, bool keepdim = false) const;
  Tensor var(const Shape& dims, bool unbiased = true, bool keepdim = false) const;
  Tensor max() const;
  Tensor min() const;
  Tensor argmax(int64_t dim, bool keepdim = false) const;

  // In-place; refused on tensors that require grad while grad mode is on.
  Tensor& add_(const Tensor& other, double alpha = 1.0);
  Tensor& mul_(const Tensor& other);
  Tensor& mul_(double value);
  Tensor& zero_();
  Tensor& fill_(double value);

 private:
  TensorImpl& impl() const;
  std::shared_ptr<TensorImpl> impl_;
};

// A tensor viewing `storage` (no copy); the caller guarantees the view fits.
Tensor make_tensor(Storage storage, Shape shape, Shape strides, int64_t offset, DType dtype);
// A fresh contiguous tensor with uninitialised data.
Tensor empty(const Shape& shape, TensorOptions options = {});
// ... laid out in `format` (Contiguous or ChannelsLast).
Tensor empty(const Shape& shape, TensorOptions options, MemoryFormat format);

std::ostream& operator<<(std::ostream& out, const Tensor& tensor);

}  // namespace loom
