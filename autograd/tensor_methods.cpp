// Tensor's PyTorch-style methods (x.sum(), x.reshape(...), x.add_(...)): thin forwards
// to the differentiable ops of autograd/ops.h, plus the in-place ops.
#include "autograd/ops.h"
#include "autograd/ops/common.h"
#include "core/copy.h"

namespace loom {

Tensor Tensor::view(const Shape& shape) const { return loom::view(*this, shape); }
Tensor Tensor::reshape(const Shape& shape) const { return loom::reshape(*this, shape); }
Tensor Tensor::permute(const Shape& dims) const { return loom::permute(*this, dims); }
Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const { return loom::transpose(*this, dim0, dim1); }
Tensor Tensor::t() const {
  LOOM_CHECK(dim() <= 2, "t() expects a tensor with <= 2 dimensions, got shape ", shape());
  return dim() < 2 ? *this : loom::transpose(*this, 0, 1);
}
Tensor Tensor::narrow(int64_t dim, int64_t start, int64_t length) const { return loom::narrow(*this, dim, start, length); }
Tensor Tensor::slice(int64_t dim, int64_t start, int64_t end, int64_t step) const {
  return loom::slice(*this, dim, start, end, step);
}
Tensor Tensor::select(int64_t dim, int64_t index) const { return loom::select(*this, dim, index); }
Tensor Tensor::expand(const Shape& shape) const { return loom::expand(*this, shape); }
Tensor Tensor::squeeze() const { return loom::squeeze(*this); }
Tensor Tensor::squeeze(int64_t dim) const { return loom::squeeze(*this, dim); }
Tensor Tensor::unsqueeze(int64_t dim) const { return loom::unsqueeze(*this, dim); }
Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const { return loom::flatten(*this, start_dim, end_dim); }
Tensor Tensor::contiguous() const { return loom::contiguous(*this); }
Tensor Tensor::contiguous(MemoryFormat format) const { return loom::contiguous(*this, format); }
Tensor Tensor::clone() const { return loom::clone(*this); }
Tensor Tensor::to(Device device, bool non_blocking) const { return loom::to(*this, device, non_blocking); }
Tensor Tensor::to(DType dtype) const { return loom::to(*this, dtype); }
std::vector<Tensor> Tensor::split(int64_t split_size, int64_t dim) const { return loom::split(*this, split_size, dim); }
std::vector<Tensor> Tensor::chunk(int64_t chunks, int64_t dim) const { return loom::chunk(*this, chunks, dim); }
Tensor Tensor::index_select(int64_t dim, const Tensor& index) const { return loom::index_select(*this, dim, index); }
Tensor Tensor::gather(int64_t dim, const Tensor& index) const { return loom::gather(*this, dim, index); }

Tensor Tensor::add(const Tensor& other, double alpha) const { return loom::add(*this, other, alpha); }
Tensor Tensor::sub(const Tensor& other, double alpha) const { return loom::sub(*this, other, alpha); }
Tensor Tensor::mul(const Tensor& other) const { return loom::mul(*this, other); }
Tensor Tensor::div(const Tensor& other) const { return loom::div(*this, other); }
Tensor Tensor::neg() const { return loom::neg(*this); }
Tensor Tensor::exp() const { return loom::exp(*this); }
Tensor Tensor::log() const { return loom::log(*this); }
Tensor Tensor::sqrt() const { return loom::sqrt(*this); }
Tensor Tensor::rsqrt() const { return loom::rsqrt(*this); }
Tensor Tensor::pow(double exponent) const { return loom::pow(*this, exponent); }
Tensor Tensor::abs() const { return loom::abs(*this); }
Tensor Tensor::clamp(double min, double max) const { return loom::clamp(*this, min, max); }
Tensor Tensor::relu() const { return loom::relu(*this); }
Tensor Tensor::sigmoid() const { return loom::sigmoid(*this); }
Tensor Tensor::tanh() const { return loom::tanh(*this); }
Tensor Tensor::matmul(const Tensor& other) const { return loom::matmul(*this, other); }

Tensor Tensor::sum() const { return loom::sum(*this); }
Tensor Tensor::sum(const Shape& dims, bool keepdim) const { return loom::sum(*this, dims, keepdim); }
Tensor Tensor::mean() const { return loom::mean(*this); }
Tensor Tensor::mean(const Shape& dims, bool keepdim) const { return loom::mean(*this, dims, keepdim); }
Tensor Tensor::var(const Shape& dims, bool unbiased, bool keepdim) const { return loom::var(*this, dims, unbiased, keepdim); }
Tensor Tensor::max() const { return loom::max(*this); }
Tensor Tensor::min() const { return loom::min(*this); }
Tensor Tensor::argmax(int64_t dim, bool keepdim) const { return loom::argmax(*this, dim, keepdim); }

// ---- in-place -------------------------------------------------------------------------
// Each writes through the kernels directly (no graph) and bumps the version counter:
// see Note [Version counter].

Tensor& Tensor::add_(const Tensor& other, double alpha) {
  ops::check_inplace("add_", *this, other);
  ops::check_same_device_dtype("add_", *this, other);
  if (alpha != 1.0) check_scalar_fits(alpha, dtype(), "add_: alpha");
  Shape shape = broadcast_shapes(this->shape(), other.shape());
  LOOM_CHECK(shape == this->shape(), "add_: the result of broadcasting, ", shape,
             ", does not fit the in-place tensor of shape ", this->shape());
  binary_kernel(device())(BinaryOp::Add, *this, other.detach().expand(shape), alpha, *this);
  bump_version();
  return *this;
}

Tensor& Tensor::mul_(const Tensor& other) {
  ops::check_inplace("mul_", *this, other);
  ops::check_same_device_dtype("mul_", *this, other);
  Shape shape = broadcast_shapes(this->shape(), other.shape());
  LOOM_CHECK(shape == this->shape(), "mul_: the result of broadcasting, ", shape,
             ", does not fit the in-place tensor of shape ", this->shape());
  binary_kernel(device())(BinaryOp::Mul, *this, other.detach().expand(shape), 1.0, *this);
  bump_version();
  return *this;
}

Tensor& Tensor::mul_(double value) { return mul_(wrap_scalar(value, *this)); }

Tensor& Tensor::fill_(double value) {
  ops::check_inplace("fill_", *this);
  check_scalar_fits(value, dtype(), "fill_");
  fill_kernel(device())(*this, value);
  bump_version();
  return *this;
}

Tensor& Tensor::zero_() { return fill_(0.0); }

Tensor& Tensor::copy_(const Tensor& src, bool non_blocking) {
  ops::check_inplace("copy_", *this, src);
  ops::check_defined("copy_", src, "source");
  Shape shape = broadcast_shapes(this->shape(), src.shape());
  LOOM_CHECK(shape == this->shape(), "copy_: source of shape ", src.shape(), " cannot be broadcast to ",
             this->shape());
  copy_into(*this, src.detach().expand(shape), non_blocking);
  bump_version();
  return *this;
}

}  // namespace loom
