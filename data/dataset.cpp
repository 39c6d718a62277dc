#include "data/dataset.h"

#include <cstring>  // defines: std::memcpy

#include "core/copy.h"  // defines: copy_into, for non-contiguous samples

namespace loom::data {

Example Dataset::operator[](int64_t index) const {
  SampleRng rng(AugmentSeed{}, index);
  return get(index, rng);
}

void Dataset::check_index(int64_t index, const char* what) const {
  LOOM_CHECK(index >= 0 && index < size(), what, ": index ", index, " is out of range for a dataset of ", size(),
             " examples (valid: 0..", size() - 1, ")");
}

// default_collate: stack the examples into one [B, ...] tensor. The batch shape comes
// from the first example; every later one must match it, as torch.stack requires.
Batch Dataset::get_batch(std::span<const int64_t> indices, AugmentSeed augment) const {
  LOOM_CHECK(!indices.empty(), "Dataset::get_batch: a batch needs at least one index");
  const auto count = static_cast<int64_t>(indices.size());
  Batch batch;
  batch.target = empty({count}, kInt64);
  int64_t* targets = batch.target.data_ptr<int64_t>();
  Shape sample_shape;
  for (int64_t k = 0; k < count; ++k) {
    const int64_t index = indices[static_cast<size_t>(k)];
    SampleRng rng(augment, index);
    Example example = get(index, rng);
    LOOM_CHECK(example.data.defined(), "collate: dataset index ", index, " returned an undefined data tensor");
    if (k == 0) {
      sample_shape = example.data.shape();
      Shape batch_shape = {count};
      batch_shape.insert(batch_shape.end(), sample_shape.begin(), sample_shape.end());
      batch.data = empty(batch_shape, TensorOptions(example.data.dtype()));
    }
    LOOM_CHECK(example.data.shape() == sample_shape && example.data.dtype() == batch.data.dtype(),
               "collate: dataset index ", index, " (position ", k, " in the batch) is ", example.data.str(),
               " but the batch's first example (index ", indices[0], ") was ", dtype_name(batch.data.dtype()), " ",
               sample_shape, "; every example in a batch must have the same shape and dtype, as torch.stack requires");
    const int64_t sample_numel = numel(sample_shape);
    if (example.data.is_contiguous() && example.data.device() == batch.data.device()) {
      std::memcpy(static_cast<char*>(batch.data.raw_data()) + k * static_cast<int64_t>(example.data.nbytes()),
                  example.data.raw_data(), example.data.nbytes());
    } else {
      Tensor slot = make_tensor(batch.data.storage(), sample_shape, contiguous_strides(sample_shape),
                                k * sample_numel, batch.data.dtype());
      copy_into(slot, example.data);
    }
    targets[k] = example.target;
  }
  return batch;
}

}  // namespace loom::data
