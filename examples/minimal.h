// What every examples/*_minimal.cpp program shares. Two flags, so that the test suite can
// run each one for a few steps without the CIFAR-10 files:
//   --max-steps N at most N optimizer steps in all (default: every epoch in full), as
//                 train_cifar10's flag; --steps N is the same
// They print "epoch E loss L" counting epochs from 1, as train_cifar10 does.
//   --synthetic   data::SyntheticCIFAR (random CIFAR-shaped images) instead of CIFAR10
// Anything else is an error naming the argument: these programs are meant to be read,
// so their knobs are constants in the code, as in the Python they mirror.
// And the training set of PyTorch's CIFAR-10 guide (ddp_minimal.cpp spells it out line by
// line; the other programs take it from here to keep to what their mode changes).
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdlib>  // defines: strtoll
#include <memory>
#include <string>

#include "core/error.h"               // defines: LOOM_CHECK
#include "data/cifar10.h"             // defines: CIFAR10
#include "data/data_root.h"           // defines: find_cifar10_root
#include "data/synthetic_cifar.h"     // defines: SyntheticCIFAR (--synthetic)
#include "data/transforms.h"          // defines: Compose, RandomCrop, ...

namespace loom::examples {

struct MinimalFlags {
  int64_t steps = -1;  // -1: no limit
  bool synthetic = false;

  // True while step `step` (0-based, counted over every epoch) is to be run.
  bool runs(int64_t step) const { return steps < 0 || step < steps; }
};

inline MinimalFlags parse_minimal_flags(int argc, char** argv) {
  MinimalFlags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--synthetic") {
      flags.synthetic = true;
    } else if (arg == "--max-steps" || arg == "--steps") {
      LOOM_CHECK(i + 1 < argc, arg, ": expected a count of 0 or more after it, got nothing");
      char* end = nullptr;
      errno = 0;
      flags.steps = std::strtoll(argv[++i], &end, 10);
      LOOM_CHECK(*argv[i] != '\0' && *end == '\0' && errno == 0 && flags.steps >= 0, arg,
                 ": expected a count of 0 or more, got '", argv[i], "'");
    } else {
      LOOM_FAIL(argv[0], ": unexpected argument '", arg, "'; the flags are --max-steps N and --synthetic");
    }
  }
  return flags;
}

// torchvision.datasets.CIFAR10(root, train=True, transform=T.Compose([T.RandomCrop(32, padding=4),
//     T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010))]))
// or, with --synthetic, `synthetic_size` random images through the same transforms.
inline std::shared_ptr<data::Dataset> cifar10_train_set(const MinimalFlags& flags, int64_t synthetic_size = 2048) {
  namespace T = data::transforms;
  auto transform = std::make_shared<T::Compose>(T::RandomCrop(32, 4), T::RandomHorizontalFlip(), T::ToTensor(),
                                                T::Normalize({0.4914, 0.4822, 0.4465}, {0.2023, 0.1994, 0.2010}));
  if (flags.synthetic) return std::make_shared<data::SyntheticCIFAR>(synthetic_size, 0, transform);
  return std::make_shared<data::CIFAR10>(data::find_cifar10_root(), true, transform);
}

}  // namespace loom::examples
