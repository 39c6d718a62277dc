// Factories: new tensors from sizes, values, ranges and random distributions.
// Names and meaning as in PyTorch (torch.zeros, torch.arange, torch.randn, ...).
#pragma once

#include <cstdint>
#include <vector>

#include "core/generator.h"
#include "core/tensor.h"

namespace loom {

Tensor zeros(const Shape& shape, TensorOptions options = {});
Tensor ones(const Shape& shape, TensorOptions options = {});
Tensor full(const Shape& shape, double value, TensorOptions options = {});
// Refuses a scalar that `dtype` cannot hold exactly (0.5, NaN or 1e30 for an integer
// dtype): silently truncating it would be a wrong answer. `what` names the caller.
void check_scalar_fits(double value, DType dtype, const char* what);
Tensor zeros_like(const Tensor& like);
Tensor ones_like(const Tensor& like);
// Preserve (the default, as PyTorch's): channels-last if `like` is (Note [Channels-last
// activations]), else contiguous.
Tensor empty_like(const Tensor& like, MemoryFormat format = MemoryFormat::Preserve);
// A 0-dim tensor holding `value`.
Tensor scalar_tensor(double value, TensorOptions options = {});

// [start, end) in steps of `step`; int64 unless options say otherwise.
Tensor arange(double start, double end, double step = 1, TensorOptions options = TensorOptions(kInt64));
Tensor arange(int64_t end, TensorOptions options = TensorOptions(kInt64));

// Uniform in [0, 1), standard normal, integers in [low, high); from `gen`, or from the
// default generator (seeded by manual_seed) when gen is null.
Tensor rand(const Shape& shape, TensorOptions options = {}, Generator* gen = nullptr);
Tensor randn(const Shape& shape, TensorOptions options = {}, Generator* gen = nullptr);
Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions options = TensorOptions(kInt64),
               Generator* gen = nullptr);
// A random permutation of 0..n-1 (int64), as torch.randperm.
Tensor randperm(int64_t n, Generator* gen = nullptr);

// Copies host values into a new tensor; numel(shape) must equal values.size().
template <typename T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, TensorOptions options = TensorOptions(dtype_of<T>()));
// Copies `numel(shape)` values of dtype from `data` (host memory).
Tensor from_blob(const void* data, const Shape& shape, TensorOptions options);

}  // namespace loom
