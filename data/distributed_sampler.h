// DistributedSampler: each of num_replicas ranks sees its own share of the dataset, as
// torch.utils.data.distributed.DistributedSampler.
//
//   auto sampler = std::make_shared<DistributedSampler>(train->size(), world_size, rank);
//   DataLoader loader(train, {.batch_size = 128, .sampler = sampler});
//   for (int64_t epoch = 0; epoch < epochs; ++epoch) {
//     sampler->set_epoch(epoch);   // else every epoch repeats epoch 0's order
//     for (Batch& batch : loader) ...
//   }
//
// Note [DistributedSampler index assignment]
// PyTorch's exact structure, so that a PyTorch user's arithmetic holds:
//   1. order = shuffle ? a permutation of 0..N-1 by a generator seeded with seed + epoch
//      (loom's own generator, so not torch's numbers) : 0..N-1;
//   2. without drop_last, total_size = ceil(N / R) * R and the order is padded to it
//      by repeating indices from its start (cyclically when N < R);
//      with drop_last, total_size = floor(N / R) * R and the order is cut to it;
//   3. rank r takes order[r : total_size : R], so every rank gets total_size / R indices.
// Every rank must use the same seed: it computes the same order and takes its stride.
// Padding means a few samples count twice per epoch; drop_last means a few are skipped.
#pragma once

#include <cstdint>
#include <vector>

#include "data/sampler.h"

namespace loom::data {

// num_samples per rank: ceil(N / R), or floor(N / R) with drop_last.
int64_t distributed_num_samples(int64_t dataset_size, int64_t num_replicas, bool drop_last);
// Rank `rank`'s indices for `epoch`: see Note [DistributedSampler index assignment].
std::vector<int64_t> distributed_indices(int64_t dataset_size, int64_t num_replicas, int64_t rank, bool shuffle,
                                         uint64_t seed, int64_t epoch, bool drop_last);

class DistributedSampler : public Sampler {
 public:
  DistributedSampler(int64_t dataset_size, int64_t num_replicas, int64_t rank, bool shuffle = true, uint64_t seed = 0,
                     bool drop_last = false);

  int64_t size() const override { return num_samples_; }
  // This rank's indices for the current epoch. With shuffle on, a pass that starts
  // without set_epoch() since the previous pass repeats that order: warned once on stderr.
  std::vector<int64_t> next_pass() override;
  void set_epoch(int64_t epoch) override;

  int64_t epoch() const { return epoch_; }
  int64_t num_replicas() const { return num_replicas_; }
  int64_t rank() const { return rank_; }
  int64_t total_size() const { return num_samples_ * num_replicas_; }

 private:
  int64_t dataset_size_, num_replicas_, rank_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  int64_t num_samples_;
  int64_t epoch_ = 0;
  int64_t passes_ = 0;
  bool epoch_set_since_last_pass_ = false;
  bool warned_ = false;
};

}  // namespace loom::data
