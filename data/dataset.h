// Dataset: a map from an index in [0, size()) to one training example, as
// torch.utils.data.Dataset (__len__ and __getitem__).
//
//   class Squares : public loom::data::Dataset {
//     int64_t size() const override { return 100; }
//     Example get(int64_t i, SampleRng&) const override {
//       return {loom::full({1}, double(i * i)), i % 2};
//     }
//   };
//
// Two ways in: get() for one example (dataset[i] spelling: operator[]), and get_batch()
// for a whole batch, which the DataLoader calls. The default get_batch() is PyTorch's
// default_collate: it stacks get() results; datasets that can do better (decode straight
// into the batch buffer, see image_dataset.h) override it.
//
// Note [Dataset thread-safety]
// DataLoader workers are threads sharing one Dataset object, so get() and get_batch()
// are const and must be safe to call concurrently. Keep per-sample state on the stack;
// randomness comes from the SampleRng argument (see Note [Per-sample randomness]).
#pragma once

#include <cstdint>
#include <span>

#include "core/tensor.h"
#include "data/sample_rng.h"

namespace loom::data {

struct Example {
  Tensor data;
  int64_t target = 0;
};

// A collated batch: data is the examples stacked along a new dim 0, target is int64 [B].
struct Batch {
  Tensor data;
  Tensor target;
  int64_t size() const { return target.defined() ? target.size(0) : 0; }
};

class Dataset {
 public:
  virtual ~Dataset() = default;

  virtual int64_t size() const = 0;
  // Example `index`; random transforms draw from `rng`. Thread-safe: see Note [Dataset thread-safety].
  virtual Example get(int64_t index, SampleRng& rng) const = 0;
  // Examples `indices`, collated. Sample k draws from SampleRng(augment, indices[k]), so
  // the batch is the same whichever thread builds it.
  virtual Batch get_batch(std::span<const int64_t> indices, AugmentSeed augment) const;

  // dataset[i]: the example as epoch 0 of seed 0 would see it.
  Example operator[](int64_t index) const;

 protected:
  // For subclasses: a loom::Error unless 0 <= index < size(), naming `what` (the dataset).
  void check_index(int64_t index, const char* what) const;
};

}  // namespace loom::data
