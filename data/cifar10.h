// CIFAR10: the official binary version of CIFAR-10, as torchvision.datasets.CIFAR10.
//
//   std::string root = loom::data::find_cifar10_root(flag);   // data/data_root.h
//   loom::data::CIFAR10 train(root, /*train=*/true, train_transform);   // 50,000 images
//   loom::data::CIFAR10 test(root, /*train=*/false, test_transform);    // 10,000 images
//
// File format (https://www.cs.toronto.edu/~kriz/cifar.html, "binary version"): each of
// data_batch_1..5.bin (train) and test_batch.bin (test) is a run of 3073-byte records,
// 1 label byte (0..9) then 3072 pixel bytes: the 32x32 red plane, then green, then
// blue, each row-major. Records are read in file order, so index i is the i-th record
// of the concatenated files, as in torchvision. Unlike torchvision, root is the
// cifar-10-batches-bin folder itself, and there is no download flag: no network access
// is assumed (see cifar10_download_hint()).
//
// Everything is validated at load, with the path in every message: a missing file, a
// size that is not a whole number of records, a label outside 0..9.
#pragma once

#include <string>
#include <vector>

#include "data/image_dataset.h"

namespace loom::data {

class CIFAR10 : public ImageDataset {
 public:
  static constexpr int64_t kImageBytes = 3 * 32 * 32;
  static constexpr int64_t kRecordBytes = 1 + kImageBytes;
  static constexpr int64_t kNumClasses = 10;

  explicit CIFAR10(const std::string& root, bool train = true, transforms::TransformPtr transform = nullptr);

  bool train() const { return train_; }
  const std::string& root() const { return root_; }
  // Class names in label order ("airplane", ..., "truck"), as dataset.classes.
  static const std::vector<std::string>& classes();

 private:
  std::string root_;
  bool train_;
};

}  // namespace loom::data
