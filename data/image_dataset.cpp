#include "data/image_dataset.h"

#include "core/factory.h"  // defines: from_blob

namespace loom::data {

ImageDataset::ImageDataset(std::string name, Shape image_shape, ImageData data, transforms::TransformPtr transform)
    : name_(std::move(name)),
      image_shape_(std::move(image_shape)),
      image_bytes_(numel(image_shape_)),
      pixels_(std::move(data.pixels)),
      targets_(std::move(data.targets)) {
  LOOM_CHECK(image_shape_.size() == 3, name_, ": images are [C, H, W], got shape ", image_shape_);
  LOOM_CHECK(static_cast<int64_t>(pixels_.size()) == image_bytes_ * size(), name_, ": ", pixels_.size(),
             " pixel bytes do not hold ", size(), " images of shape ", image_shape_, " (", image_bytes_ * size(),
             " bytes)");
  set_transform(std::move(transform));
}

void ImageDataset::set_transform(transforms::TransformPtr transform) {
  transform_ = std::move(transform);
  fused_.reset();
  if (transform_) {
    (void)transform_->output_shape(image_shape_);  // refuse a chain that can't take these images, now
    fused_ = FusedImageTransform::plan(*transform_, image_shape_);
  }
}

const uint8_t* ImageDataset::image(int64_t index) const {
  check_index(index, name_.c_str());
  return pixels_.data() + index * image_bytes_;
}

int64_t ImageDataset::target(int64_t index) const {
  check_index(index, name_.c_str());
  return targets_[static_cast<size_t>(index)];
}

Example ImageDataset::get(int64_t index, SampleRng& rng) const {
  Tensor pixels = from_blob(image(index), image_shape_, kUInt8);
  return {transform_ ? transform_->forward(pixels, rng) : pixels, target(index)};
}

Batch ImageDataset::get_batch(std::span<const int64_t> indices, AugmentSeed augment) const {
  if (!fused_) return Dataset::get_batch(indices, augment);
  LOOM_CHECK(!indices.empty(), name_, ": a batch needs at least one index");
  const auto count = static_cast<int64_t>(indices.size());
  const Shape sample_shape = fused_->output_shape();
  const int64_t sample_numel = numel(sample_shape);
  Batch batch;
  batch.data = empty({count, sample_shape[0], sample_shape[1], sample_shape[2]}, kFloat32);
  batch.target = empty({count}, kInt64);
  float* out = batch.data.data_ptr<float>();
  int64_t* targets = batch.target.data_ptr<int64_t>();
  for (int64_t k = 0; k < count; ++k) {
    const int64_t index = indices[static_cast<size_t>(k)];
    SampleRng rng(augment, index);  // See Note [Per-sample randomness]
    fused_->apply(image(index), rng, out + k * sample_numel);
    targets[k] = targets_[static_cast<size_t>(index)];
  }
  return batch;
}

}  // namespace loom::data
