// SyntheticCIFAR: CIFAR-10-shaped random data, for throughput runs and tests that must
// not depend on files.
//
//   loom::data::SyntheticCIFAR fake(/*size=*/50000, /*seed=*/0, train_transform);
//
// Same image shape (uint8 [3, 32, 32]), same label range, same code path through
// ImageDataset and the fused augmentation as CIFAR10; pixels are uniform random bytes
// and labels uniform in [0, num_classes), both a pure function of (seed, index), as
// torchvision.datasets.FakeData. Nothing to learn, so use it to time, not to train.
#pragma once

#include <cstdint>

#include "data/image_dataset.h"

namespace loom::data {

class SyntheticCIFAR : public ImageDataset {
 public:
  explicit SyntheticCIFAR(int64_t size = 50000, uint64_t seed = 0, transforms::TransformPtr transform = nullptr,
                          int64_t num_classes = 10);
};

}  // namespace loom::data
