// Bucket assignment for DDP's gradient all-reduce: which parameters share a bucket.
//
// Note [Bucket order]
// Backward produces gradients roughly in reverse registration order (the last layer's
// first). Buckets are therefore filled walking the parameters from the last registered
// to the first, so bucket 0 holds the gradients that become ready first and its
// all-reduce can start while backward is still running through earlier layers. The
// first bucket is kept small (1 MiB, PyTorch's _DEFAULT_FIRST_BUCKET_BYTES) so that
// communication starts as early as possible; later buckets are bucket_cap_mb (25 MiB
// by default) so that each collective is large enough to run at full bandwidth.
// A bucket holds one dtype on one device only: it is one flat tensor.
//
// This is policy, so it is a pure function of sizes: it is unit-tested without any
// communicator, as PyTorch's compute_bucket_assignment_by_size is.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"

namespace loom::ddp {

struct ParameterInfo {
  int64_t numel = 0;
  DType dtype = kFloat32;
  Device device;
};

constexpr size_t kDefaultFirstBucketBytes = 1 << 20;
constexpr size_t kDefaultBucketCapBytes = 25u << 20;

// Returns buckets of parameter indices. Within a bucket, indices are in the order they
// were added (reverse registration order); buckets are in the order they fill.
// size_limits: the byte limit of the 1st, 2nd, ... bucket of each (dtype, device);
// the last limit repeats. A parameter larger than the limit gets a bucket of its own.
std::vector<std::vector<size_t>> compute_bucket_assignment_by_size(const std::vector<ParameterInfo>& params,
                                                                   const std::vector<size_t>& size_limits);

// Note [A small last bucket]
// The last bucket is launched by the very last gradient (conv1's, in a ResNet), so its
// all_reduce cannot overlap any computation: backward waits for all of it. Walking from
// the last parameter, that bucket gets whatever is left over (8.3 MiB for ResNet18),
// however long it takes. So the parameters registered first, which backward finishes
// last, are split off into a final bucket of at most `last_bucket_bytes` (one parameter
// at least): the rest of the old last bucket is launched earlier, while backward still
// computes those first layers (layer1 of a CIFAR ResNet, its most expensive stage), and
// only a small all_reduce is left after the last gradient. PyTorch does not do this.
// Returns `buckets` with its last bucket split that way, if it is larger than the limit.
std::vector<std::vector<size_t>> split_last_bucket(std::vector<std::vector<size_t>> buckets,
                                                   const std::vector<ParameterInfo>& params, size_t last_bucket_bytes);

}  // namespace loom::ddp
