#include "core/tensor.h"

#include <iomanip>
#include <sstream>

#include "core/copy.h"
#include "core/error.h"

namespace loom {

TensorImpl::TensorImpl(Storage storage_, Shape shape_, Shape strides_, int64_t offset_, DType dtype_)
    : storage(std::move(storage_)), shape(std::move(shape_)), strides(std::move(strides_)), offset(offset_), dtype(dtype_) {}

TensorImpl& Tensor::impl() const {
  LOOM_CHECK(impl_, "this tensor is undefined (default-constructed, or a gradient that was never computed)");
  return *impl_;
}

int64_t Tensor::size(int64_t dim_) const { return shape()[wrap_dim(dim_, dim())]; }
int64_t Tensor::stride(int64_t dim_) const { return strides()[wrap_dim(dim_, dim())]; }

bool Tensor::is_contiguous() const {
  const Shape& sh = shape();
  const Shape& st = strides();
  int64_t expected = 1;
  for (int64_t d = static_cast<int64_t>(sh.size()) - 1; d >= 0; --d) {
    if (sh[d] == 1) continue;  // a size-1 dim's stride never matters
    if (st[d] != expected) return false;
    expected *= sh[d];
  }
  return true;
}

bool Tensor::is_contiguous(MemoryFormat format) const {
  if (format == MemoryFormat::Preserve) return true;  // every tensor is in its own format
  return is_contiguous_as(shape(), strides(), format);
}

MemoryFormat Tensor::suggest_memory_format() const { return loom::suggest_memory_format(shape(), strides()); }

void* Tensor::raw_data() const {
  const TensorImpl& self = impl();
  return static_cast<char*>(self.storage->data()) + self.offset * static_cast<int64_t>(loom::element_size(self.dtype));
}

std::string Tensor::str() const {
  if (!defined()) return "Tensor[undefined]";
  return detail::str("Tensor[", dtype(), ", ", shape_str(shape()), ", ", device().str(), "]");
}

template <typename T>
std::vector<T> Tensor::tolist() const {
  LOOM_CHECK(dtype_of<T>() == dtype(), "tolist: tensor has dtype ", dtype(), " but was asked for ", dtype_of<T>());
  Tensor host = empty(shape(), TensorOptions(dtype()));
  copy_into(host, *this, /*non_blocking=*/false);
  const T* p = host.data_ptr<T>();
  return std::vector<T>(p, p + numel());
}

template <typename T>
T Tensor::item() const {
  LOOM_CHECK(numel() == 1, "item(): expected a tensor with one element, got shape ", shape());
  return tolist<T>()[0];
}

#define LOOM_INSTANTIATE_HOST_ACCESS(T) \
  template std::vector<T> Tensor::tolist<T>() const; \
  template T Tensor::item<T>() const;
LOOM_INSTANTIATE_HOST_ACCESS(float)
LOOM_INSTANTIATE_HOST_ACCESS(double)
LOOM_INSTANTIATE_HOST_ACCESS(int64_t)
LOOM_INSTANTIATE_HOST_ACCESS(int32_t)
LOOM_INSTANTIATE_HOST_ACCESS(uint8_t)
LOOM_INSTANTIATE_HOST_ACCESS(bool)
#undef LOOM_INSTANTIATE_HOST_ACCESS

Tensor make_tensor(Storage storage, Shape shape, Shape strides, int64_t offset, DType dtype) {
  return Tensor(std::make_shared<TensorImpl>(std::move(storage), std::move(shape), std::move(strides), offset, dtype));
}

Tensor empty(const Shape& shape, TensorOptions options) { return empty(shape, options, MemoryFormat::Contiguous); }

Tensor empty(const Shape& shape, TensorOptions options, MemoryFormat format) {
  for (int64_t size : shape)
    LOOM_CHECK(size >= 0, "empty: sizes must be non-negative, got shape ", shape);
  const auto count = static_cast<size_t>(numel(shape));
  LOOM_CHECK(count <= SIZE_MAX / element_size(options.dtype_), "empty: shape ", shape, " of ", options.dtype_,
             " needs more bytes than a size_t can count");
  auto storage = std::make_shared<StorageImpl>(count * element_size(options.dtype_), options.device_);
  Tensor t = make_tensor(std::move(storage), shape, strides_for(shape, format), 0, options.dtype_);
  if (options.requires_grad_) t.requires_grad_(true);
  return t;
}

std::ostream& operator<<(std::ostream& out, const Tensor& tensor) {
  out << tensor.str();
  if (!tensor.defined() || tensor.numel() > 64 || !is_floating(tensor.dtype())) return out;
  Tensor values = tensor.dtype() == kFloat64 ? tensor.detach() : tensor.detach().to(kFloat64);
  out << " {";
  auto list = values.tolist<double>();
  for (size_t i = 0; i < list.size(); ++i) out << (i ? ", " : "") << std::setprecision(6) << list[i];
  return out << "}";
}

}  // namespace loom
