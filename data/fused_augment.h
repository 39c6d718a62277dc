// FusedImageTransform: the CIFAR training transform as one loop from uint8 pixels
// straight into the float batch buffer.
//
// The reference path (transforms.h) makes four tensors per image: padded crop, flip,
// ToTensor, Normalize. For a transform chain of the shape
//
//     [RandomCrop(size, padding, fill)] [RandomHorizontalFlip(p)] ToTensor() [Normalize(mean, std)]
//
// (brackets: optional; nested Compose is flattened) applied to a uint8 [C, H, W] image,
// the same result is a gather: output pixel (c, y, x) reads source pixel
// (c, top + y - padding, flip ? left + w_out - 1 - x - padding : left + x - padding),
// or the fill value outside the image, then maps the byte through a 256-entry table per
// channel holding Normalize(ToTensor(byte)). The table is built with the very helpers
// the reference path uses (ToTensor::to_unit, Normalize::apply), and the window and flip
// are drawn with RandomCrop::get_params and RandomHorizontalFlip::flips in the same
// order, so the two paths agree bit for bit (tests/test_transforms.cpp checks it).
// Any other chain returns nullopt from plan(), and the dataset uses the reference path.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "core/shape.h"
#include "data/sample_rng.h"
#include "data/transforms.h"

namespace loom::data {

class FusedImageTransform {
 public:
  // A plan for `transform` on uint8 images of `image_shape` [C, H, W], or nullopt when
  // the chain isn't one this loop covers.
  static std::optional<FusedImageTransform> plan(const transforms::Transform& transform, const Shape& image_shape);

  // Float32 [C, out_h, out_w].
  Shape output_shape() const { return {channels_, out_h_, out_w_}; }
  // Transforms one image (`pixels`: uint8 [C, H, W]) into `out` (output_shape() floats).
  void apply(const uint8_t* pixels, SampleRng& rng, float* out) const;

 private:
  FusedImageTransform() = default;

  int64_t channels_ = 0, in_h_ = 0, in_w_ = 0, out_h_ = 0, out_w_ = 0;
  std::optional<transforms::RandomCrop> crop_;
  std::optional<transforms::RandomHorizontalFlip> flip_;
  int64_t padding_ = 0;
  uint8_t fill_ = 0;
  std::vector<float> table_;  // [C][256]: Normalize(ToTensor(byte)) for channel c
};

}  // namespace loom::data
