#include "data/fused_augment.h"

#include <algorithm>
#include <cmath>

namespace loom::data {

using namespace transforms;

namespace {

void flatten(const Transform& transform, std::vector<const Transform*>& out) {
  if (const auto* compose = dynamic_cast<const Compose*>(&transform)) {
    for (const auto& t : compose->transforms()) flatten(*t, out);
  } else {
    out.push_back(&transform);
  }
}

}  // namespace

std::optional<FusedImageTransform> FusedImageTransform::plan(const Transform& transform, const Shape& image_shape) {
  if (image_shape.size() != 3) return std::nullopt;
  std::vector<const Transform*> chain;
  flatten(transform, chain);

  FusedImageTransform plan;
  plan.channels_ = image_shape[0];
  plan.in_h_ = plan.out_h_ = image_shape[1];
  plan.in_w_ = plan.out_w_ = image_shape[2];
  size_t at = 0;
  if (at < chain.size()) {
    if (const auto* crop = dynamic_cast<const RandomCrop*>(chain[at])) {
      // Only a uint8 pixel value can be the padding byte fed through the table; the
      // gather below reads a constant border, not a reflected one.
      const double fill = crop->fill();
      if (fill != std::floor(fill) || fill < 0 || fill > 255) return std::nullopt;
      if (crop->padding_mode() != PaddingMode::constant) return std::nullopt;
      (void)crop->output_shape(image_shape);  // the reference path's size check and error
      plan.crop_ = *crop;
      plan.padding_ = crop->padding();
      plan.fill_ = static_cast<uint8_t>(fill);
      plan.out_h_ = crop->height();
      plan.out_w_ = crop->width();
      ++at;
    }
  }
  if (at < chain.size()) {
    if (const auto* flip = dynamic_cast<const RandomHorizontalFlip*>(chain[at])) {
      plan.flip_ = *flip;
      ++at;
    }
  }
  const auto* to_tensor = at < chain.size() ? dynamic_cast<const ToTensor*>(chain[at]) : nullptr;
  if (!to_tensor || to_tensor->resolve(plan.output_shape()) != ToTensor::Layout::CHW) return std::nullopt;
  ++at;
  const Normalize* normalize = nullptr;
  if (at < chain.size() && (normalize = dynamic_cast<const Normalize*>(chain[at]))) {
    (void)normalize->output_shape(plan.output_shape());  // channel-count check and error
    ++at;
  }
  if (at != chain.size()) return std::nullopt;

  plan.table_.resize(static_cast<size_t>(plan.channels_) * 256);
  for (int64_t c = 0; c < plan.channels_; ++c)
    for (int v = 0; v < 256; ++v) {
      const float unit = ToTensor::to_unit(static_cast<uint8_t>(v));
      plan.table_[static_cast<size_t>(c * 256 + v)] = normalize ? normalize->apply(unit, c) : unit;
    }
  return plan;
}

void FusedImageTransform::apply(const uint8_t* pixels, SampleRng& rng, float* out) const {
  // Draw order matches the reference chain: crop window first, then the flip.
  RandomCrop::Window window;
  if (crop_) window = crop_->get_params(rng, in_h_ + 2 * padding_, in_w_ + 2 * padding_);
  const bool flip = flip_ && flip_->flips(rng);

  // Output columns [x_begin, x_end) read inside the source row; the rest is padding.
  // Unflipped, x reads sx = left + x - padding; flipped, sx = left + out_w - 1 - x - padding.
  const int64_t shift = window.left - padding_;
  const int64_t x_begin = flip ? std::max<int64_t>(0, shift + out_w_ - in_w_) : std::max<int64_t>(0, -shift);
  const int64_t x_end = flip ? std::min<int64_t>(out_w_, shift + out_w_) : std::min<int64_t>(out_w_, in_w_ - shift);
  for (int64_t c = 0; c < channels_; ++c) {
    const float* table = table_.data() + c * 256;
    const float pad = table[fill_];
    for (int64_t y = 0; y < out_h_; ++y) {
      float* dst = out + (c * out_h_ + y) * out_w_;
      const int64_t sy = window.top + y - padding_;
      if (sy < 0 || sy >= in_h_ || x_begin >= x_end) {
        std::fill(dst, dst + out_w_, pad);
        continue;
      }
      const uint8_t* row = pixels + (c * in_h_ + sy) * in_w_;
      std::fill(dst, dst + x_begin, pad);
      if (flip) {
        const int64_t mirror = shift + out_w_ - 1;
        for (int64_t x = x_begin; x < x_end; ++x) dst[x] = table[row[mirror - x]];
      } else {
        for (int64_t x = x_begin; x < x_end; ++x) dst[x] = table[row[shift + x]];
      }
      std::fill(dst + x_end, dst + out_w_, pad);
    }
  }
}

}  // namespace loom::data
