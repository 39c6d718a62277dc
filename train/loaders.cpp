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

// The training images' augmentation: RandomCrop(32, padding, padding_mode) and the flip,
// each left out where it does nothing (padding 0, flip none).
T::TransformPtr augmentation(const DataConfig& d) {
  std::vector<T::TransformPtr> chain;
  if (d.crop_padding > 0)
    chain.push_back(std::make_shared<T::RandomCrop>(
        32, d.crop_padding, 0, d.padding_mode == "reflect" ? T::PaddingMode::reflect : T::PaddingMode::constant));
  if (d.flip == "random") chain.push_back(std::make_shared<T::RandomHorizontalFlip>());
  if (d.flip == "alternating") chain.push_back(std::make_shared<T::AlternatingHorizontalFlip>());
  chain.push_back(std::make_shared<T::ToTensor>());
  chain.push_back(std::make_shared<T::Normalize>(kMean, kStd));
  return std::make_shared<T::Compose>(std::move(chain));
}

std::shared_ptr<data::Dataset> make_dataset(const TrainConfig& config, bool train) {
  T::TransformPtr transform = train && config.data.augment
                                  ? augmentation(config.data)
                                  : std::make_shared<T::Compose>(T::ToTensor(), T::Normalize(kMean, kStd));
  if (config.data.synthetic) {
    return std::make_shared<data::SyntheticCIFAR>(train ? config.data.synthetic_size : 10000,
                                                  config.training.seed + (train ? 0 : 1), transform);
  }
  return std::make_shared<data::CIFAR10>(data::find_cifar10_root(config.data.root), train, transform);
}

}  // namespace loom::training
