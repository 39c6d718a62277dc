// DataLoader: batches from a Dataset, in sampler order, prepared ahead by worker
// threads, as torch.utils.data.DataLoader.
//
//   auto train = std::make_shared<loom::data::CIFAR10>(root, true, train_transform);
//   loom::data::DataLoader loader(train, {.batch_size = 128, .shuffle = true, .num_workers = 2, .seed = 0});
//   for (int64_t epoch = 0; epoch < epochs; ++epoch) {
//     loader.set_epoch(epoch);                 // optional; see "Epochs" below
//     for (loom::data::Batch& batch : loader)  // batch.data [128, 3, 32, 32] float32,
//       train_step(batch.data, batch.target);  // batch.target [128] int64
//   }
//
// Options (a struct, so C++20 designated initializers read like PyTorch's keyword
// arguments; keep this field order):
//   batch_size          examples per batch; the last is smaller unless drop_last
//   shuffle             a RandomSampler seeded with `seed`; excludes `sampler`
//   sampler             any Sampler (e.g. DistributedSampler); shared, so the caller can
//                       keep it to call set_epoch
//   num_workers         threads preparing batches; 0 = in the consumer's thread
//   prefetch_factor     batches in flight per worker: at most num_workers * prefetch_factor
//                       batches exist ahead of the consumer (ignored when num_workers = 0)
//   pin_memory          accepted for PyTorch compatibility; a no-op while batches are
//                       plain CPU tensors (with a CUDA backend it would mean page-locked
//                       batches for asynchronous host-to-device copies)
//   drop_last           drop the last incomplete batch
//   persistent_workers  keep the threads between passes (needs num_workers > 0)
//   seed                seeds shuffling and every random transform
//
// Epochs. Each begin() (each `for` over the loader) is one pass = one epoch. Pass k uses
// epoch e + k, where e is the last set_epoch() value (0 if never called), for both the
// augmentation and a shuffle=true order. set_epoch(e) is forwarded to the sampler, so a
// DistributedSampler follows it too. Calling it every epoch makes a resumed run replay
// exactly (the loader itself keeps no other state).
//
// Determinism. A batch depends only on (its indices, seed, epoch), never on which worker
// built it: num_workers = 0, 1 or 8 give bit-identical batches. See Note [Per-sample
// randomness] and Note [In-order prefetch].
//
// Errors. An exception while building a batch (in any thread) reaches the consumer as a
// loom::Error at that batch's turn, naming the batch, the worker, the epoch and the
// dataset indices, with the original message; the pass ends and a new begin() starts
// afresh. The destructor stops and joins the workers; it never waits on the consumer.
#pragma once

#include <cstdint>
#include <iterator>
#include <memory>

#include "data/dataset.h"
#include "data/sampler.h"
#include "data/worker_pool.h"

namespace loom::data {

struct DataLoaderOptions {
  int64_t batch_size = 1;
  bool shuffle = false;
  std::shared_ptr<Sampler> sampler = nullptr;
  int64_t num_workers = 0;
  int64_t prefetch_factor = 2;
  bool pin_memory = false;
  bool drop_last = false;
  bool persistent_workers = false;
  uint64_t seed = 0;
};

class DataLoader {
 public:
  class Iterator;

  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options = {});
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // len(loader): batches per pass.
  int64_t size() const;
  // Starts a new pass (cancelling an unfinished one: its iterators become invalid).
  Iterator begin();
  std::default_sentinel_t end() const { return {}; }

  // The epoch of the next pass; forwarded to the sampler.
  void set_epoch(int64_t epoch);
  // The epoch of the current (or last) pass; -1 before the first.
  int64_t epoch() const { return pass_ ? pass_->augment.epoch : -1; }

  const Dataset& dataset() const { return *dataset_; }
  Sampler& sampler() const { return *sampler_; }
  const DataLoaderOptions& options() const { return options_; }

 private:
  // Everything one pass needs, shared with the workers so it outlives them.
  struct Pass {
    uint64_t id = 0;
    std::vector<int64_t> indices;  // the sampler's order
    int64_t num_batches = 0;
    AugmentSeed augment;
  };
  static Batch load(const Dataset& dataset, const Pass& pass, int64_t batch_size, int64_t batch, int64_t worker);
  // The next batch of pass `pass_id`, or false at its end.
  bool next(uint64_t pass_id, Batch& out);
  void end_pass();

  std::shared_ptr<const Dataset> dataset_;
  DataLoaderOptions options_;
  std::shared_ptr<Sampler> sampler_;
  int64_t next_epoch_ = 0;
  std::shared_ptr<const Pass> pass_;
  int64_t consumed_ = 0;  // batches of pass_ handed out
  std::unique_ptr<WorkerPool> workers_;  // last: destroyed (joined) first
};

// An input iterator over one pass: `for (Batch& batch : loader)`.
class DataLoader::Iterator {
 public:
  using value_type = Batch;
  using difference_type = std::ptrdiff_t;

  Batch& operator*() { return batch_; }
  Batch* operator->() { return &batch_; }
  Iterator& operator++() {
    advance();
    return *this;
  }
  void operator++(int) { advance(); }
  bool operator==(std::default_sentinel_t) const { return done_; }

 private:
  friend class DataLoader;
  Iterator(DataLoader* loader, uint64_t pass_id) : loader_(loader), pass_id_(pass_id) { advance(); }
  void advance() { done_ = !loader_->next(pass_id_, batch_); }

  DataLoader* loader_;
  uint64_t pass_id_;
  Batch batch_;
  bool done_ = false;
};

}  // namespace loom::data
