// Samplers: the order in which a DataLoader visits dataset indices, as
// torch.utils.data.Sampler, SequentialSampler and RandomSampler. DistributedSampler
// lives in data/distributed_sampler.h.
//
// Each order is a pure function (sequential_indices, random_permutation) that tests call
// directly; the classes only add the epoch bookkeeping a training loop needs.
#pragma once

#include <cstdint>
#include <vector>

namespace loom::data {

class Sampler {
 public:
  virtual ~Sampler() = default;
  // len(sampler): how many indices one pass yields.
  virtual int64_t size() const = 0;
  // The indices of the next pass over the data, as Python's iter(sampler). Stateful for
  // samplers that shuffle: see each class for how its epoch advances.
  virtual std::vector<int64_t> next_pass() = 0;
  // The epoch the next pass belongs to (DistributedSampler.set_epoch). The DataLoader
  // forwards its own set_epoch here. Samplers without randomness ignore it.
  virtual void set_epoch(int64_t epoch) { (void)epoch; }
};

// 0, 1, ..., n - 1.
std::vector<int64_t> sequential_indices(int64_t n);
// A permutation of 0..n-1 drawn by a Generator seeded with `seed` (loom::randperm):
// the same (n, seed) always gives the same order, on every machine.
std::vector<int64_t> random_permutation(int64_t n, uint64_t seed);
// len(loader) for a sampler of `num_indices`: ceil(n / batch_size), or floor with drop_last.
int64_t num_batches(int64_t num_indices, int64_t batch_size, bool drop_last);

class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(int64_t size);
  int64_t size() const override { return size_; }
  std::vector<int64_t> next_pass() override { return sequential_indices(size_); }

 private:
  int64_t size_;
};

// A fresh permutation each pass: pass of epoch e is random_permutation(size, seed + e).
// The epoch starts at 0 and advances by one per pass (as torch's RandomSampler, whose
// generator moves on each pass); set_epoch(e) makes the next pass epoch e, so a resumed
// run replays exactly. Sampling with replacement and num_samples are not implemented.
class RandomSampler : public Sampler {
 public:
  explicit RandomSampler(int64_t size, uint64_t seed = 0);
  int64_t size() const override { return size_; }
  std::vector<int64_t> next_pass() override;
  void set_epoch(int64_t epoch) override { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }  // of the next pass

 private:
  int64_t size_;
  uint64_t seed_;
  int64_t epoch_ = 0;
};

}  // namespace loom::data
