#include "data/dataloader.h"

#include <algorithm>
#include <span>

#include "core/error.h"

namespace loom::data {

namespace {

std::string describe_indices(std::span<const int64_t> indices) {
  std::string out = "[";
  const size_t shown = std::min<size_t>(indices.size(), 8);
  for (size_t i = 0; i < shown; ++i) out += (i ? ", " : "") + std::to_string(indices[i]);
  if (shown < indices.size()) out += ", ... (" + std::to_string(indices.size()) + " in all)";
  return out + "]";
}

}  // namespace

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), options_(std::move(options)) {
  LOOM_CHECK(dataset_ != nullptr, "DataLoader: dataset is null");
  LOOM_CHECK(options_.batch_size >= 1, "DataLoader: batch_size should be a positive integer value, got ",
             options_.batch_size);
  LOOM_CHECK(options_.num_workers >= 0, "DataLoader: num_workers option should be non-negative, got ",
             options_.num_workers, "; use num_workers=0 to load in the main thread");
  LOOM_CHECK(options_.num_workers == 0 || options_.prefetch_factor >= 1,
             "DataLoader: prefetch_factor must be >= 1 with worker threads, got ", options_.prefetch_factor);
  LOOM_CHECK(options_.num_workers <= WorkerPool::kMaxWorkers, "DataLoader: num_workers ", options_.num_workers,
             " is more threads than loom starts (at most ", WorkerPool::kMaxWorkers, ")");
  LOOM_CHECK(options_.num_workers == 0 ||
                 options_.prefetch_factor <= WorkerPool::kMaxCapacity / options_.num_workers,
             "DataLoader: num_workers x prefetch_factor (", options_.num_workers, " x ", options_.prefetch_factor,
             ") batches in flight is more than loom holds (at most ", WorkerPool::kMaxCapacity, ")");
  LOOM_CHECK(!options_.persistent_workers || options_.num_workers > 0,
             "DataLoader: persistent_workers option needs num_workers > 0 (there are no worker threads to keep)");
  LOOM_CHECK(!(options_.shuffle && options_.sampler), "DataLoader: sampler option is mutually exclusive with shuffle; "
             "a custom sampler decides the order itself (DistributedSampler has its own shuffle argument)");
  if (options_.sampler) sampler_ = options_.sampler;
  else if (options_.shuffle) sampler_ = std::make_shared<RandomSampler>(dataset_->size(), options_.seed);
  else sampler_ = std::make_shared<SequentialSampler>(dataset_->size());
}

DataLoader::~DataLoader() = default;  // workers_ joins its threads

int64_t DataLoader::size() const { return num_batches(sampler_->size(), options_.batch_size, options_.drop_last); }

void DataLoader::set_epoch(int64_t epoch) {
  next_epoch_ = epoch;
  sampler_->set_epoch(epoch);
}

DataLoader::Iterator DataLoader::begin() {
  // The old pass's workers must stop before its state goes: cancel (persistent) or join.
  if (options_.persistent_workers && workers_) workers_->cancel();
  else workers_.reset();

  auto pass = std::make_shared<Pass>();
  pass->id = pass_ ? pass_->id + 1 : 1;
  pass->indices = sampler_->next_pass();
  pass->num_batches = num_batches(static_cast<int64_t>(pass->indices.size()), options_.batch_size, options_.drop_last);
  pass->augment = AugmentSeed{options_.seed, next_epoch_++};
  pass_ = pass;
  consumed_ = 0;

  if (options_.num_workers > 0) {
    if (!workers_)
      workers_ = std::make_unique<WorkerPool>(options_.num_workers, options_.num_workers * options_.prefetch_factor);
    // The producer holds the dataset and the pass by shared_ptr: see Note [In-order prefetch].
    workers_->start(pass->num_batches, [dataset = dataset_, pass, batch_size = options_.batch_size](int64_t batch,
                                                                                                    int64_t worker) {
      return load(*dataset, *pass, batch_size, batch, worker);
    });
  }
  return Iterator(this, pass->id);
}

Batch DataLoader::load(const Dataset& dataset, const Pass& pass, int64_t batch_size, int64_t batch, int64_t worker) {
  const int64_t first = batch * batch_size;
  const int64_t count = std::min<int64_t>(batch_size, static_cast<int64_t>(pass.indices.size()) - first);
  const std::span<const int64_t> indices(pass.indices.data() + first, static_cast<size_t>(count));
  std::string what;
  try {
    return dataset.get_batch(indices, pass.augment);  // pin_memory: nothing to do for CPU batches
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
    what = "an exception that is not a std::exception";
  }
  const std::string where = worker < 0 ? "the main thread (num_workers=0)" : "worker " + std::to_string(worker);
  LOOM_FAIL("DataLoader: ", where, " failed to load batch ", batch, " of ", pass.num_batches, " (epoch ",
            pass.augment.epoch, ", dataset indices ", describe_indices(indices), "):\n  ", what);
}

bool DataLoader::next(uint64_t pass_id, Batch& out) {
  LOOM_CHECK(pass_ && pass_->id == pass_id, "DataLoader: this iterator belongs to pass ", pass_id,
             ", but begin() has since started pass ", pass_ ? pass_->id : 0,
             "; only the newest iterator of a loader is valid");
  if (consumed_ >= pass_->num_batches) {
    end_pass();
    return false;
  }
  try {
    out = workers_ ? workers_->next() : load(*dataset_, *pass_, options_.batch_size, consumed_, -1);
  } catch (...) {
    consumed_ = pass_->num_batches;  // the pass is over; stop the other workers too
    end_pass();
    throw;
  }
  ++consumed_;
  return true;
}

void DataLoader::end_pass() {
  if (!workers_) return;
  if (options_.persistent_workers) workers_->cancel();
  else workers_.reset();
}

}  // namespace loom::data
