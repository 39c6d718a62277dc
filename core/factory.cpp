#include "core/factory.h"

#include <cmath>
#include <cstring>

#include "core/copy.h"
#include "core/error.h"
#include "core/kernels.h"

namespace loom {

void check_scalar_fits(double value, DType dtype, const char* what) {
  if (is_floating(dtype) || dtype == kBool) return;  // bool: nonzero is true, as in PyTorch
  double lo = 0, end = 256;                          // uint8: [lo, end)
  if (dtype == kInt32) lo = -2147483648.0, end = 2147483648.0;
  if (dtype == kInt64) lo = -9223372036854775808.0, end = 9223372036854775808.0;
  LOOM_CHECK(std::floor(value) == value && value >= lo && value < end, what, ": the scalar ", value,
             " is not a value of ", dtype, " (whole numbers from ", lo, " to below ", end, "). loom does not "
             "promote dtypes, where PyTorch would make a floating tensor: convert first, e.g. x.to(kFloat32)");
}

Tensor full(const Shape& shape, double value, TensorOptions options) {
  check_scalar_fits(value, options.dtype_, "full");
  bool requires_grad = options.requires_grad_;
  Tensor t = empty(shape, options.requires_grad(false));
  if (t.numel() > 0) fill_kernel(t.device())(t, value);
  if (requires_grad) t.requires_grad_(true);
  return t;
}

Tensor zeros(const Shape& shape, TensorOptions options) { return full(shape, 0.0, options); }
Tensor ones(const Shape& shape, TensorOptions options) { return full(shape, 1.0, options); }
namespace {
Tensor full_like(const Tensor& like, double value) {  // in like's format, as PyTorch's *_like
  Tensor t = empty_like(like);
  if (t.numel() > 0) fill_kernel(t.device())(t, value);
  return t;
}
}  // namespace

Tensor zeros_like(const Tensor& like) { return full_like(like, 0.0); }
Tensor ones_like(const Tensor& like) { return full_like(like, 1.0); }
Tensor empty_like(const Tensor& like, MemoryFormat format) {
  if (format == MemoryFormat::Preserve) format = like.suggest_memory_format();
  return empty(like.shape(), TensorOptions(like.dtype()).device(like.device()), format);
}
Tensor scalar_tensor(double value, TensorOptions options) { return full({}, value, options); }

Tensor arange(double start, double end, double step, TensorOptions options) {
  LOOM_CHECK(std::isfinite(start) && std::isfinite(end) && std::isfinite(step), "arange: start, end and step must "
             "be finite, got ", start, ", ", end, ", ", step);
  LOOM_CHECK(step != 0, "arange: step must be nonzero");
  // PyTorch infers a floating dtype from a fractional start or step; loom's default is
  // int64, so it asks rather than truncate (arange(0, 1, 0.3) would be [0, 0, 0, 0]).
  LOOM_CHECK(is_floating(options.dtype_) || (std::floor(start) == start && std::floor(step) == step), "arange: start ",
             start, " and step ", step, " are not both whole numbers, for a result of ", options.dtype_,
             "; pass a floating dtype, e.g. arange(", start, ", ", end, ", ", step, ", kFloat32)");
  LOOM_CHECK((end - start) / step >= 0, "arange: upper bound and step are inconsistent: start ", start,
             ", end ", end, ", step ", step);
  auto n = static_cast<int64_t>(std::ceil((end - start) / step));
  std::vector<double> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[static_cast<size_t>(i)] = start + static_cast<double>(i) * step;
  return from_vector(values, {n}, options);
}

Tensor arange(int64_t end, TensorOptions options) { return arange(0, static_cast<double>(end), 1, options); }

namespace {
Tensor random_tensor(const Shape& shape, TensorOptions options, const auto& fill) {
  bool requires_grad = options.requires_grad_;
  Tensor t = empty(shape, options.requires_grad(false));
  if (t.numel() > 0) fill(t);
  if (requires_grad) t.requires_grad_(true);
  return t;
}
}  // namespace

Tensor rand(const Shape& shape, TensorOptions options, Generator* gen) {
  Generator& g = gen ? *gen : default_generator();
  return random_tensor(shape, options, [&](Tensor& t) { uniform_kernel(t.device())(t, 0.0, 1.0, g); });
}

Tensor randn(const Shape& shape, TensorOptions options, Generator* gen) {
  Generator& g = gen ? *gen : default_generator();
  return random_tensor(shape, options, [&](Tensor& t) { normal_kernel(t.device())(t, 0.0, 1.0, g); });
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions options, Generator* gen) {
  LOOM_CHECK(low < high, "randint: expected low < high, got low=", low, " high=", high);
  Generator& g = gen ? *gen : default_generator();
  return random_tensor(shape, options, [&](Tensor& t) { randint_kernel(t.device())(t, low, high, g); });
}

Tensor randperm(int64_t n, Generator* gen) {
  LOOM_CHECK(n >= 0, "randperm: n must be non-negative, got ", n);
  Generator& g = gen ? *gen : default_generator();
  std::vector<int64_t> perm(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) perm[static_cast<size_t>(i)] = i;
  // Fisher-Yates with counter-based draws: see Note [Counter-based randomness].
  uint64_t first = g.reserve(static_cast<uint64_t>(n));
  for (int64_t i = n - 1; i > 0; --i) {
    auto j = static_cast<int64_t>(random_bits(g.seed(), first + static_cast<uint64_t>(i)) % static_cast<uint64_t>(i + 1));
    std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(j)]);
  }
  return from_vector(perm, {n});
}

Tensor from_blob(const void* data, const Shape& shape, TensorOptions options) {
  Tensor host = empty(shape, TensorOptions(options.dtype_));
  // An empty vector's data() may be null, and memcpy from null is undefined even for
  // 0 bytes (UBSan's nonnull check, in ./test.sh --sanitize address,undefined).
  if (host.nbytes() > 0) std::memcpy(host.raw_data(), data, host.nbytes());
  Tensor out = options.device_ == Device() ? host : empty(shape, options.requires_grad(false));
  if (!out.is_same(host)) copy_into(out, host);
  if (options.requires_grad_) out.requires_grad_(true);
  return out;
}

template <typename T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, TensorOptions options) {
  LOOM_CHECK(static_cast<int64_t>(values.size()) == numel(shape), "from_vector: ", values.size(),
             " values cannot fill shape ", shape, " (", numel(shape), " elements)");
  Tensor host = from_blob(values.data(), shape, TensorOptions(dtype_of<T>()));
  if (options.dtype_ == dtype_of<T>() && options.device_ == Device()) {
    if (options.requires_grad_) host.requires_grad_(true);
    return host;
  }
  Tensor out = empty(shape, options.requires_grad(false));
  copy_into(out, host);
  if (options.requires_grad_) out.requires_grad_(true);
  return out;
}

template Tensor from_vector<float>(const std::vector<float>&, const Shape&, TensorOptions);
template Tensor from_vector<double>(const std::vector<double>&, const Shape&, TensorOptions);
template Tensor from_vector<int64_t>(const std::vector<int64_t>&, const Shape&, TensorOptions);
template Tensor from_vector<int32_t>(const std::vector<int32_t>&, const Shape&, TensorOptions);
template Tensor from_vector<uint8_t>(const std::vector<uint8_t>&, const Shape&, TensorOptions);

}  // namespace loom
