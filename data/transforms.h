// Image transforms, as torchvision.transforms: ToTensor, Normalize, RandomCrop,
// RandomHorizontalFlip, chained by Compose.
//
//   using namespace loom::data::transforms;
//   auto train_transform = std::make_shared<Compose>(
//       RandomCrop(32, /*padding=*/4), RandomHorizontalFlip(), ToTensor(),
//       Normalize({0.4914, 0.4822, 0.4465}, {0.2470, 0.2435, 0.2616}));
//   loom::data::CIFAR10 train(root, /*train=*/true, train_transform);
//
// Images are tensors laid out [C, H, W] (loom's image datasets yield uint8 CHW, the
// layout of the CIFAR files) where torchvision would hand transforms a PIL image; the
// geometric transforms work on any dtype, ToTensor turns uint8 into float32 in [0, 1].
//
// Random transforms draw from the SampleRng they are given, never from a global or
// per-thread generator: see Note [Per-sample randomness].
//
// This is the readable reference path, one tensor per step. ImageDataset runs the common
// uint8 -> crop -> flip -> ToTensor -> Normalize chain as one fused loop straight into
// the batch (data/fused_augment.h); both paths call the helpers below (get_params,
// flips, to_unit, Normalize::apply), so they draw and round identically.
#pragma once

#include <concepts>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "core/tensor.h"
#include "data/sample_rng.h"

namespace loom::data::transforms {

class Transform {
 public:
  virtual ~Transform() = default;
  virtual Tensor forward(const Tensor& input, SampleRng& rng) const = 0;
  // The shape forward() returns for an input of shape `input` (a loom::Error if forward
  // would refuse it); lets a dataset size a batch before building any example.
  virtual Shape output_shape(const Shape& input) const { return input; }
  // As torchvision prints it: "RandomCrop(size=(32, 32), padding=4)".
  virtual std::string repr() const = 0;

  Tensor operator()(const Tensor& input, SampleRng& rng) const { return forward(input, rng); }
  // For deterministic transforms and quick looks: draws as dataset index 0 of epoch 0.
  Tensor operator()(const Tensor& input) const;
};

using TransformPtr = std::shared_ptr<const Transform>;

namespace detail {
template <typename T>
TransformPtr to_ptr(T transform) {
  if constexpr (std::is_convertible_v<T, TransformPtr>) return transform;
  else return std::make_shared<T>(std::move(transform));
}
template <typename T>
concept TransformLike = std::derived_from<std::decay_t<T>, Transform> || std::is_convertible_v<T, TransformPtr>;
}  // namespace detail

class Compose : public Transform {
 public:
  explicit Compose(std::vector<TransformPtr> transforms);
  // Compose(RandomCrop(32, 4), ToTensor()): each argument a transform or a TransformPtr.
  template <detail::TransformLike... T>
    requires(sizeof...(T) > 1 || !(std::same_as<std::decay_t<T>, Compose> && ...))
  explicit Compose(T... transforms) : Compose(std::vector<TransformPtr>{detail::to_ptr(std::move(transforms))...}) {}

  Tensor forward(const Tensor& input, SampleRng& rng) const override;
  Shape output_shape(const Shape& input) const override;
  std::string repr() const override;
  const std::vector<TransformPtr>& transforms() const { return transforms_; }

 private:
  std::vector<TransformPtr> transforms_;
};

// uint8 image -> float32 [C, H, W] in [0, 1] (value / 255), as transforms.ToTensor().
// A [H, W] image becomes [1, H, W]. Layout::Auto reads a 3-d image as CHW when its
// first dim is 1, 3 or 4 (loom's datasets), else as HWC when its last dim is (numpy,
// image files); say which explicitly when an image is ambiguous or neither.
class ToTensor : public Transform {
 public:
  enum class Layout { Auto, CHW, HWC };
  explicit ToTensor(Layout layout = Layout::Auto) : layout_(layout) {}
  Tensor forward(const Tensor& input, SampleRng& rng) const override;
  Shape output_shape(const Shape& input) const override;
  std::string repr() const override { return "ToTensor()"; }
  // The layout an input of this shape is read as (CHW also for 2-d); error if unknown.
  Layout resolve(const Shape& input) const;
  static float to_unit(uint8_t value) { return static_cast<float>(value) / 255.0f; }

 private:
  Layout layout_;
};

// (x - mean[c]) / std[c] per channel of a float [..., C, H, W] tensor, as
// transforms.Normalize. One mean/std value applies to every channel.
class Normalize : public Transform {
 public:
  Normalize(std::vector<double> mean, std::vector<double> std);
  Tensor forward(const Tensor& input, SampleRng& rng) const override;
  Shape output_shape(const Shape& input) const override;
  std::string repr() const override;
  const std::vector<double>& mean() const { return mean_; }
  const std::vector<double>& std() const { return std_; }
  // The one formula both the reference and the fused path use, in the tensor's type.
  template <typename T>
  T apply(T x, int64_t channel) const {
    const size_t c = mean_.size() == 1 ? 0 : static_cast<size_t>(channel);
    return (x - static_cast<T>(mean_[c])) / static_cast<T>(std_[c]);
  }

 private:
  std::vector<double> mean_, std_;
};

// How RandomCrop fills the border it adds: torchvision's padding_mode "constant" (the
// value `fill`) or "reflect" (the image mirrored about its edge pixel, which is not
// repeated: no flat border whose edge a net could learn).
enum class PaddingMode { constant, reflect };

// Pads every side of an [..., H, W] image by `padding` pixels, then cuts a size_h x size_w
// window at a random position, as transforms.RandomCrop(size, padding, fill=fill,
// padding_mode=mode). A 32 x 32 crop of an image padded by t is a translation by up to t
// pixels each way (airbench's "reflect translate" is padding t, mode reflect).
class RandomCrop : public Transform {
 public:
  RandomCrop(int64_t size, int64_t padding = 0, double fill = 0, PaddingMode mode = PaddingMode::constant)
      : RandomCrop({size, size}, padding, fill, mode) {}
  RandomCrop(std::pair<int64_t, int64_t> size, int64_t padding = 0, double fill = 0,
             PaddingMode mode = PaddingMode::constant);
  Tensor forward(const Tensor& input, SampleRng& rng) const override;
  Shape output_shape(const Shape& input) const override;
  std::string repr() const override;

  struct Window { int64_t top = 0, left = 0; };  // in padded coordinates
  // The window for a padded image of padded_h x padded_w, as RandomCrop.get_params:
  // top drawn first, then left; no draw at all when the crop is the whole image.
  Window get_params(SampleRng& rng, int64_t padded_h, int64_t padded_w) const;
  int64_t height() const { return size_h_; }
  int64_t width() const { return size_w_; }
  int64_t padding() const { return padding_; }
  double fill() const { return fill_; }
  PaddingMode padding_mode() const { return mode_; }

 private:
  int64_t size_h_, size_w_, padding_;
  double fill_;
  PaddingMode mode_;
};

// Mirrors the last dim (width) with probability p, as transforms.RandomHorizontalFlip.
class RandomHorizontalFlip : public Transform {
 public:
  explicit RandomHorizontalFlip(double p = 0.5);
  Tensor forward(const Tensor& input, SampleRng& rng) const override;
  std::string repr() const override;
  // One uniform draw, flip when it is below p (torch: `if torch.rand(1) < self.p`).
  bool flips(SampleRng& rng) const { return rng.uniform() < p_; }
  double p() const { return p_; }

 private:
  double p_;
};

// Mirrors the last dim (width) by airbench's alternating rule (Note [Alternating flip],
// data/sample_rng.h): a coin per image drawn once, inverted every odd epoch, so each pair
// of consecutive epochs shows every image both ways. Draws nothing from the sample's own
// stream (its coin comes from epoch 0's), so the transforms after it draw as they would
// without it. torchvision has no such transform.
class AlternatingHorizontalFlip : public Transform {
 public:
  Tensor forward(const Tensor& input, SampleRng& rng) const override;
  std::string repr() const override { return "AlternatingHorizontalFlip()"; }
  static bool flips(const SampleRng& rng) {
    return alternating_flip(rng.augment().seed, rng.augment().epoch, rng.index());
  }
};

}  // namespace loom::data::transforms
