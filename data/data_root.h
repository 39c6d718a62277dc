// Where the CIFAR-10 files live: the --data flag, else $LOOM_DATA, else the usual spots.
//
//   std::string root = loom::data::find_cifar10_root(args.data);  // std::optional<std::string>
//   loom::data::CIFAR10 train(root, /*train=*/true, transform);
//
// Search order (the first folder holding all six .bin files wins):
//   1. the --data value, then $LOOM_DATA: a folder with the .bin files, or its parent
//      (torchvision-style root holding cifar-10-batches-bin/). When given, these must be
//      right: a wrong explicit path is an error, never silently passed over;
//   2. data/cifar-10-batches-bin and ../shared/data/cifar-10-batches-bin, relative to
//      the current directory and then to the loom source tree (so tests, which run in
//      the build folder, find the data too).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace loom::data {

std::string find_cifar10_root(const std::optional<std::string>& flag = std::nullopt);

// The six files of the official binary version, training batches first.
const std::vector<std::string>& cifar10_file_names();

// How to obtain the dataset and point loom at it: the tail of every "not found" error.
std::string cifar10_download_hint();

}  // namespace loom::data
