// SavedTensor: a tensor kept by a backward closure, with an in-place-modification check.
//
// Note [Saved tensors]
// A backward closure keeps what it needs as a *detached alias*: same storage, no
// autograd metadata. So saving an op's own output (exp, relu, sigmoid do) creates no
// reference cycle output -> grad_fn -> saved output. The alias also records the
// storage version (Note [Version counter]); get() refuses if it has moved, because the
// values backward would read are no longer those the forward used.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace loom {

class SavedTensor {
 public:
  SavedTensor() = default;
  SavedTensor(const Tensor& tensor, const char* saved_by);  // NOLINT
  // The saved values; a loom::Error if they were modified in place since saving.
  const Tensor& get() const;
  bool defined() const { return tensor_.defined(); }

 private:
  Tensor tensor_;
  uint32_t version_ = 0;
  const char* saved_by_ = "";
};

}  // namespace loom
