#include "train/loaders.h"

#include <vector>

#include "data/cifar10.h"          // defines: CIFAR10
#include "data/data_root.h"        // defines: find_cifar10_root
#include "data/synthetic_cifar.h"  // defines: SyntheticCIFAR
#include "data/transforms.h"       // defines: Compose, RandomCrop, ...

namespace loom::training {

namespace {

namespace T = data::transforms;

// The normalisation constants of examples/reference/train_ddp.py, for training and test alike.
const std::vector<double> kMean = {0.4914, 0.4822, 0.4465};
const std::vector<double> kStd = {0.2023, 0.1994, 0.2010};

}  // namespace

std::shared_ptr<data::Dataset> make_dataset(const TrainConfig& config, bool train) {
  T::TransformPtr transform = train && config.data.augment
                                  ? std::make_shared<T::Compose>(T::RandomCrop(32, 4), T::RandomHorizontalFlip(),
                                                                 T::ToTensor(), T::Normalize(kMean, kStd))
                                  : std::make_shared<T::Compose>(T::ToTensor(), T::Normalize(kMean, kStd));
  if (config.data.synthetic) {
    return std::make_shared<data::SyntheticCIFAR>(train ? config.data.synthetic_size : 10000,
                                                  config.training.seed + (train ? 0 : 1), transform);
  }
  return std::make_shared<data::CIFAR10>(data::find_cifar10_root(config.data.root), train, transform);
}

}  // namespace loom::training
