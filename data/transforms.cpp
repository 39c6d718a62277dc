#include "data/transforms.h"

#include <cmath>
#include <cstring>
#include <sstream>

#include "core/copy.h"  // defines: copy_into

namespace loom::data::transforms {

namespace {

// Transforms index raw memory, so they work on a contiguous host copy of their input.
Tensor contiguous_input(const Tensor& input, const char* who) {
  LOOM_CHECK(input.defined(), who, ": got an undefined tensor");
  LOOM_CHECK(input.device().is_cpu(), who, ": expected a CPU tensor, got ", input.str(),
             "; data transforms run in the loader, before the batch moves to a device");
  if (input.is_contiguous()) return input;
  Tensor copy = empty(input.shape(), TensorOptions(input.dtype()));
  copy_into(copy, input);
  return copy;
}

void check_image_dims(const Shape& shape, const char* who) {
  LOOM_CHECK(shape.size() >= 2, who, ": expected an image [..., H, W], got shape ", shape);
}

std::string format_double(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

std::string format_list(const std::vector<double>& values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + format_double(values[i]);
  return out + "]";
}

// The image with its last dim (width) reversed.
Tensor mirrored(const Tensor& input, const char* who) {
  Tensor src = contiguous_input(input, who);
  Tensor out = empty(src.shape(), TensorOptions(src.dtype()));
  const int64_t w = src.size(-1), rows = src.numel() / w;
  const auto bytes = static_cast<int64_t>(src.element_size());
  const auto* in = static_cast<const char*>(src.raw_data());
  auto* o = static_cast<char*>(out.raw_data());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t x = 0; x < w; ++x)
      std::memcpy(o + (r * w + x) * bytes, in + (r * w + (w - 1 - x)) * bytes, static_cast<size_t>(bytes));
  return out;
}
}  // namespace

Tensor Transform::operator()(const Tensor& input) const {
  SampleRng rng(AugmentSeed{}, 0);
  return forward(input, rng);
}

// ---- Compose ----------------------------------------------------------------------

Compose::Compose(std::vector<TransformPtr> transforms) : transforms_(std::move(transforms)) {
  for (size_t i = 0; i < transforms_.size(); ++i)
    LOOM_CHECK(transforms_[i] != nullptr, "Compose: transform ", i, " is null");
}

Tensor Compose::forward(const Tensor& input, SampleRng& rng) const {
  Tensor x = input;
  for (const auto& t : transforms_) x = t->forward(x, rng);
  return x;
}

Shape Compose::output_shape(const Shape& input) const {
  Shape shape = input;
  for (const auto& t : transforms_) shape = t->output_shape(shape);
  return shape;
}

std::string Compose::repr() const {
  std::string out = "Compose(\n";
  for (const auto& t : transforms_) out += "    " + t->repr() + "\n";
  return out + ")";
}

// ---- ToTensor ---------------------------------------------------------------------

ToTensor::Layout ToTensor::resolve(const Shape& input) const {
  LOOM_CHECK(input.size() == 2 || input.size() == 3, "ToTensor: expected an image [H, W], [C, H, W] or [H, W, C], got shape ",
             input);
  if (input.size() == 2 || layout_ != Layout::Auto) return input.size() == 2 ? Layout::CHW : layout_;
  auto is_channels = [](int64_t n) { return n == 1 || n == 3 || n == 4; };
  if (is_channels(input[0])) return Layout::CHW;
  if (is_channels(input[2])) return Layout::HWC;
  LOOM_FAIL("ToTensor: cannot tell the channel dim of an image of shape ", input,
            " (expected 1, 3 or 4 channels first or last); say which with ToTensor(ToTensor::Layout::CHW) or "
            "ToTensor(ToTensor::Layout::HWC)");
}

Shape ToTensor::output_shape(const Shape& input) const {
  if (input.size() == 2) return {1, input[0], input[1]};
  return resolve(input) == Layout::CHW ? input : Shape{input[2], input[0], input[1]};
}

Tensor ToTensor::forward(const Tensor& input, SampleRng& /*rng*/) const {
  LOOM_CHECK(input.defined() && input.dtype() == kUInt8, "ToTensor: expected a uint8 image (pixel values 0..255), got ",
             input.str(), "; a float image is already a tensor, so leave ToTensor out");
  const Layout layout = resolve(input.shape());
  Tensor src = contiguous_input(input, "ToTensor");
  const Shape out_shape = output_shape(input.shape());
  Tensor out = empty(out_shape, kFloat32);
  const uint8_t* in = src.data_ptr<uint8_t>();
  float* o = out.data_ptr<float>();
  const int64_t channels = out_shape[0], plane = out_shape[1] * out_shape[2];
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t p = 0; p < plane; ++p)
      o[c * plane + p] = to_unit(layout == Layout::CHW ? in[c * plane + p] : in[p * channels + c]);
  return out;
}

// ---- Normalize --------------------------------------------------------------------

Normalize::Normalize(std::vector<double> mean, std::vector<double> std) : mean_(std::move(mean)), std_(std::move(std)) {
  LOOM_CHECK(!mean_.empty() && mean_.size() == std_.size(), "Normalize: mean and std need one value per channel (or one "
             "for all), got ", mean_.size(), " mean and ", std_.size(), " std values");
  for (size_t c = 0; c < std_.size(); ++c)
    LOOM_CHECK(std_[c] != 0, "Normalize: std[", c, "] is 0, which would divide by zero; got std ", format_list(std_));
}

Shape Normalize::output_shape(const Shape& input) const {
  LOOM_CHECK(input.size() >= 3, "Normalize: expected a float image [..., C, H, W], got shape ", input,
             "; put Normalize after ToTensor");
  const int64_t channels = input[input.size() - 3];
  LOOM_CHECK(mean_.size() == 1 || static_cast<int64_t>(mean_.size()) == channels, "Normalize: has ", mean_.size(),
             " mean/std values but the image has ", channels, " channels (shape ", input, ")");
  return input;
}

Tensor Normalize::forward(const Tensor& input, SampleRng& /*rng*/) const {
  LOOM_CHECK(input.defined(), "Normalize: got an undefined tensor");
  const Shape& shape = output_shape(input.shape());
  Tensor src = contiguous_input(input, "Normalize");
  Tensor out = empty(shape, TensorOptions(src.dtype()));
  const int64_t channels = shape[shape.size() - 3];
  const int64_t plane = shape[shape.size() - 2] * shape[shape.size() - 1];
  const int64_t images = src.numel() / (channels * plane);
  dispatch_floating(src.dtype(), "Normalize (put it after ToTensor)", [&]<typename T>() {
    const T* in = src.data_ptr<T>();
    T* o = out.data_ptr<T>();
    for (int64_t n = 0; n < images; ++n)
      for (int64_t c = 0; c < channels; ++c) {
        const int64_t base = (n * channels + c) * plane;
        for (int64_t p = 0; p < plane; ++p) o[base + p] = apply(in[base + p], c);
      }
  });
  return out;
}

std::string Normalize::repr() const { return "Normalize(mean=" + format_list(mean_) + ", std=" + format_list(std_) + ")"; }

// ---- RandomCrop -------------------------------------------------------------------

RandomCrop::RandomCrop(std::pair<int64_t, int64_t> size, int64_t padding, double fill, PaddingMode mode)
    : size_h_(size.first), size_w_(size.second), padding_(padding), fill_(fill), mode_(mode) {
  LOOM_CHECK(size_h_ > 0 && size_w_ > 0, "RandomCrop: size must be positive, got (", size_h_, ", ", size_w_, ")");
  LOOM_CHECK(padding_ >= 0, "RandomCrop: padding must be >= 0, got ", padding_);
}

Shape RandomCrop::output_shape(const Shape& input) const {
  check_image_dims(input, "RandomCrop");
  const int64_t padded_h = input[input.size() - 2] + 2 * padding_, padded_w = input[input.size() - 1] + 2 * padding_;
  LOOM_CHECK(size_h_ <= padded_h && size_w_ <= padded_w, "RandomCrop: required crop size (", size_h_, ", ", size_w_,
             ") is larger than the padded input image (", padded_h, ", ", padded_w, "): image shape ", input,
             ", padding ", padding_);
  // As torch's reflect padding: the mirror image must fit inside the image it mirrors.
  LOOM_CHECK(mode_ != PaddingMode::reflect ||
                 (padding_ < input[input.size() - 2] && padding_ < input[input.size() - 1]),
             "RandomCrop: padding_mode reflect needs padding smaller than the image's height and width, got "
             "padding ", padding_, " for image shape ", input);
  Shape out = input;
  out[out.size() - 2] = size_h_;
  out[out.size() - 1] = size_w_;
  return out;
}

RandomCrop::Window RandomCrop::get_params(SampleRng& rng, int64_t padded_h, int64_t padded_w) const {
  if (padded_h == size_h_ && padded_w == size_w_) return {};
  Window window;
  window.top = rng.randint(0, padded_h - size_h_ + 1);
  window.left = rng.randint(0, padded_w - size_w_ + 1);
  return window;
}

Tensor RandomCrop::forward(const Tensor& input, SampleRng& rng) const {
  LOOM_CHECK(input.defined(), "RandomCrop: got an undefined tensor");
  const Shape out_shape = output_shape(input.shape());
  Tensor src = contiguous_input(input, "RandomCrop");
  const int64_t h = input.size(-2), w = input.size(-1);
  const Window window = get_params(rng, h + 2 * padding_, w + 2 * padding_);
  Tensor out = empty(out_shape, TensorOptions(src.dtype()));
  const int64_t planes = src.numel() / (h * w);
  dispatch_all(src.dtype(), "RandomCrop", [&]<typename T>() {
    if constexpr (std::is_same_v<T, uint8_t>)
      LOOM_CHECK(fill_ == std::floor(fill_) && fill_ >= 0 && fill_ <= 255, "RandomCrop: fill ", fill_,
                 " is not a uint8 pixel value (0..255)");
    const T fill = static_cast<T>(fill_);
    const T* in = src.data_ptr<T>();
    T* o = out.data_ptr<T>();
    for (int64_t p = 0; p < planes; ++p)
      for (int64_t y = 0; y < size_h_; ++y)
        for (int64_t x = 0; x < size_w_; ++x) {
          // Position in the unpadded image; outside it is the constant padding, or the
          // image mirrored about its edge pixel (reflect: -1 reads 1, h reads h - 2).
          int64_t sy = window.top + y - padding_, sx = window.left + x - padding_;
          if (mode_ == PaddingMode::reflect) {
            sy = sy < 0 ? -sy : sy >= h ? 2 * (h - 1) - sy : sy;
            sx = sx < 0 ? -sx : sx >= w ? 2 * (w - 1) - sx : sx;
          }
          const bool inside = sy >= 0 && sy < h && sx >= 0 && sx < w;
          o[(p * size_h_ + y) * size_w_ + x] = inside ? in[(p * h + sy) * w + sx] : fill;
        }
  });
  return out;
}

std::string RandomCrop::repr() const {
  std::string out = loom::detail::str("RandomCrop(size=(", size_h_, ", ", size_w_, "), padding=", padding_);
  if (fill_ != 0) out += ", fill=" + format_double(fill_);
  if (mode_ == PaddingMode::reflect) out += ", padding_mode=reflect";
  return out + ")";
}

// ---- RandomHorizontalFlip ---------------------------------------------------------

RandomHorizontalFlip::RandomHorizontalFlip(double p) : p_(p) {
  LOOM_CHECK(p >= 0 && p <= 1, "RandomHorizontalFlip: p is a probability in [0, 1], got ", p);
}

Tensor RandomHorizontalFlip::forward(const Tensor& input, SampleRng& rng) const {
  LOOM_CHECK(input.defined(), "RandomHorizontalFlip: got an undefined tensor");
  check_image_dims(input.shape(), "RandomHorizontalFlip");
  return flips(rng) ? mirrored(input, "RandomHorizontalFlip") : input;
}

std::string RandomHorizontalFlip::repr() const { return "RandomHorizontalFlip(p=" + format_double(p_) + ")"; }

// ---- AlternatingHorizontalFlip ----------------------------------------------------

Tensor AlternatingHorizontalFlip::forward(const Tensor& input, SampleRng& rng) const {
  LOOM_CHECK(input.defined(), "AlternatingHorizontalFlip: got an undefined tensor");
  check_image_dims(input.shape(), "AlternatingHorizontalFlip");
  return flips(rng) ? mirrored(input, "AlternatingHorizontalFlip") : input;
}

}  // namespace loom::data::transforms
