#include "data/distributed_sampler.h"

#include <iostream>

#include "core/error.h"

namespace loom::data {

namespace {

void check_replicas(int64_t dataset_size, int64_t num_replicas, int64_t rank) {
  LOOM_CHECK(dataset_size >= 0, "DistributedSampler: dataset size must be >= 0, got ", dataset_size);
  LOOM_CHECK(num_replicas >= 1, "DistributedSampler: num_replicas (the world size) must be >= 1, got ", num_replicas);
  LOOM_CHECK(rank >= 0 && rank < num_replicas, "DistributedSampler: invalid rank ", rank, ", rank should be in the "
             "interval [0, ", num_replicas - 1, "] for num_replicas ", num_replicas,
             " (pass the process's RANK and WORLD_SIZE, as loomrun sets them)");
}

}  // namespace

int64_t distributed_num_samples(int64_t dataset_size, int64_t num_replicas, bool drop_last) {
  LOOM_CHECK(num_replicas >= 1, "DistributedSampler: num_replicas must be >= 1, got ", num_replicas);
  // PyTorch writes the drop_last case as ceil((N - R) / R), which is floor(N / R).
  if (drop_last || dataset_size == 0) return dataset_size / num_replicas;
  return (dataset_size - 1) / num_replicas + 1;  // ceil, without overflow
}

std::vector<int64_t> distributed_indices(int64_t dataset_size, int64_t num_replicas, int64_t rank, bool shuffle,
                                         uint64_t seed, int64_t epoch, bool drop_last) {
  check_replicas(dataset_size, num_replicas, rank);
  // See Note [DistributedSampler index assignment].
  std::vector<int64_t> order = shuffle ? random_permutation(dataset_size, seed + static_cast<uint64_t>(epoch))
                                       : sequential_indices(dataset_size);
  const int64_t total_size = distributed_num_samples(dataset_size, num_replicas, drop_last) * num_replicas;
  if (dataset_size > 0) {
    for (int64_t i = dataset_size; i < total_size; ++i) order.push_back(order[static_cast<size_t>(i % dataset_size)]);
  }
  order.resize(static_cast<size_t>(total_size));
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(total_size / num_replicas));
  for (int64_t i = rank; i < total_size; i += num_replicas) mine.push_back(order[static_cast<size_t>(i)]);
  return mine;
}

DistributedSampler::DistributedSampler(int64_t dataset_size, int64_t num_replicas, int64_t rank, bool shuffle,
                                       uint64_t seed, bool drop_last)
    : dataset_size_(dataset_size),
      num_replicas_(num_replicas),
      rank_(rank),
      shuffle_(shuffle),
      seed_(seed),
      drop_last_(drop_last),
      num_samples_(0) {
  check_replicas(dataset_size, num_replicas, rank);
  num_samples_ = distributed_num_samples(dataset_size, num_replicas, drop_last);
}

void DistributedSampler::set_epoch(int64_t epoch) {
  epoch_ = epoch;
  epoch_set_since_last_pass_ = true;
}

std::vector<int64_t> DistributedSampler::next_pass() {
  if (shuffle_ && passes_ > 0 && !epoch_set_since_last_pass_ && !warned_) {
    warned_ = true;
    std::cerr << "loom warning: DistributedSampler (rank " << rank_ << " of " << num_replicas_
              << ") starts another pass without set_epoch() since the last one, so it repeats the shuffled order of "
                 "epoch "
              << epoch_ << ". Call sampler->set_epoch(epoch) (or loader.set_epoch(epoch)) at the start of every "
                 "epoch, as with PyTorch's DistributedSampler.\n";
  }
  ++passes_;
  epoch_set_since_last_pass_ = false;
  return distributed_indices(dataset_size_, num_replicas_, rank_, shuffle_, seed_, epoch_, drop_last_);
}

}  // namespace loom::data
