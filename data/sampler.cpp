#include "data/sampler.h"

#include "core/error.h"
#include "core/factory.h"  // defines: randperm

namespace loom::data {

std::vector<int64_t> sequential_indices(int64_t n) {
  LOOM_CHECK(n >= 0, "sampler: dataset size must be >= 0, got ", n);
  std::vector<int64_t> indices(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) indices[static_cast<size_t>(i)] = i;
  return indices;
}

std::vector<int64_t> random_permutation(int64_t n, uint64_t seed) {
  LOOM_CHECK(n >= 0, "sampler: dataset size must be >= 0, got ", n);
  if (n == 0) return {};
  Generator generator(seed);
  return randperm(n, &generator).tolist<int64_t>();
}

int64_t num_batches(int64_t num_indices, int64_t batch_size, bool drop_last) {
  LOOM_CHECK(batch_size >= 1, "batch_size must be a positive integer, got ", batch_size);
  if (drop_last || num_indices == 0) return num_indices / batch_size;
  return (num_indices - 1) / batch_size + 1;  // ceil, without overflowing for a huge batch_size
}

SequentialSampler::SequentialSampler(int64_t size) : size_(size) {
  LOOM_CHECK(size >= 0, "SequentialSampler: dataset size must be >= 0, got ", size);
}

RandomSampler::RandomSampler(int64_t size, uint64_t seed) : size_(size), seed_(seed) {
  LOOM_CHECK(size >= 0, "RandomSampler: dataset size must be >= 0, got ", size);
}

std::vector<int64_t> RandomSampler::next_pass() {
  return random_permutation(size_, seed_ + static_cast<uint64_t>(epoch_++));
}

}  // namespace loom::data
