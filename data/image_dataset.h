// ImageDataset: images held in memory as raw uint8 [C, H, W] bytes, plus an int64
// target each, with an optional transform; the base of CIFAR10 and SyntheticCIFAR.
//
// Keeping the bytes (50,000 x 3072 = 150 MB for CIFAR-10 train) rather than float
// tensors is 4x less memory and lets each epoch re-augment from the originals.
// dataset[i] (get) returns the uint8 image, transformed when a transform is set: the
// reference path of transforms.h. get_batch, which the DataLoader calls, runs the fused
// loop of data/fused_augment.h when the transform has the CIFAR training shape, writing
// each image straight into the batch; both give identical values.
//
// Unlike torchvision, whose CIFAR10.data is [N, 32, 32, 3] (HWC), images here keep the
// file's channel-planar layout [N, 3, 32, 32]: no transpose at load, and it is the
// layout the network consumes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/fused_augment.h"
#include "data/transforms.h"

namespace loom::data {

// What an image dataset loads: size() images back to back, and their targets.
struct ImageData {
  std::vector<uint8_t> pixels;
  std::vector<int64_t> targets;
};

class ImageDataset : public Dataset {
 public:
  int64_t size() const override { return static_cast<int64_t>(targets_.size()); }
  Example get(int64_t index, SampleRng& rng) const override;
  Batch get_batch(std::span<const int64_t> indices, AugmentSeed augment) const override;

  // [C, H, W] of every stored image.
  const Shape& image_shape() const { return image_shape_; }
  // The raw bytes of image `index` (numel(image_shape()) of them).
  const uint8_t* image(int64_t index) const;
  int64_t target(int64_t index) const;
  // All targets in dataset order, as torchvision's dataset.targets.
  const std::vector<int64_t>& targets() const { return targets_; }

  const transforms::TransformPtr& transform() const { return transform_; }
  // Replaces the transform (as `dataset.transform = ...`); not while a loader is reading.
  void set_transform(transforms::TransformPtr transform);
  // Whether get_batch takes the fused path for the current transform.
  bool uses_fused_path() const { return fused_.has_value(); }

 protected:
  // `data.pixels` holds data.targets.size() images of image_shape, back to back.
  ImageDataset(std::string name, Shape image_shape, ImageData data, transforms::TransformPtr transform);
  const std::string& name() const { return name_; }

 private:
  std::string name_;  // for messages: "CIFAR10"
  Shape image_shape_;
  int64_t image_bytes_;
  std::vector<uint8_t> pixels_;
  std::vector<int64_t> targets_;
  transforms::TransformPtr transform_;
  std::optional<FusedImageTransform> fused_;
};

}  // namespace loom::data
