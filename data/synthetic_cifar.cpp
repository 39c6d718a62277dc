#include "data/synthetic_cifar.h"

#include <cstring>  // defines: std::memcpy

#include "core/generator.h"  // defines: random_bits

namespace loom::data {

namespace {

ImageData generate(int64_t size, uint64_t seed, int64_t num_classes) {
  LOOM_CHECK(size >= 0, "SyntheticCIFAR: size must be >= 0, got ", size);
  LOOM_CHECK(num_classes >= 1 && num_classes <= 256, "SyntheticCIFAR: num_classes must be in 1..256, got ", num_classes);
  constexpr int64_t kImageBytes = 3 * 32 * 32;
  ImageData data;
  data.pixels.resize(static_cast<size_t>(size * kImageBytes));
  data.targets.resize(static_cast<size_t>(size));
  // Pixel stream and label stream use different seeds so neither predicts the other.
  const uint64_t pixel_seed = random_bits(seed, 1), label_seed = random_bits(seed, 2);
  const int64_t words = size * kImageBytes / 8;  // 3072 bytes = 384 whole 64-bit words per image
  for (int64_t w = 0; w < words; ++w) {
    const uint64_t bits = random_bits(pixel_seed, static_cast<uint64_t>(w));
    std::memcpy(data.pixels.data() + w * 8, &bits, 8);
  }
  for (int64_t i = 0; i < size; ++i)
    data.targets[static_cast<size_t>(i)] =
        static_cast<int64_t>(random_bits(label_seed, static_cast<uint64_t>(i)) % static_cast<uint64_t>(num_classes));
  return data;
}

}  // namespace

SyntheticCIFAR::SyntheticCIFAR(int64_t size, uint64_t seed, transforms::TransformPtr transform, int64_t num_classes)
    : ImageDataset("SyntheticCIFAR", {3, 32, 32}, generate(size, seed, num_classes), std::move(transform)) {}

}  // namespace loom::data
