// DataLoader: identical batches for any num_workers, in-order delivery when workers
// finish out of order, len and drop_last, epochs, exception propagation without hangs,
// option validation, DistributedSampler pass-through, and worker throughput.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "core/factory.h"
#include "data/dataloader.h"
#include "data/distributed_sampler.h"
#include "data/synthetic_cifar.h"
#include "data/transforms.h"

using namespace loom;
using namespace loom::data;
using namespace loom::data::transforms;

namespace {

std::shared_ptr<SyntheticCIFAR> augmented_dataset(int64_t size) {
  return std::make_shared<SyntheticCIFAR>(
      size, /*seed=*/4,
      std::make_shared<Compose>(RandomCrop(32, 4), RandomHorizontalFlip(), ToTensor(),
                                Normalize({0.4914, 0.4822, 0.4465}, {0.2470, 0.2435, 0.2616})));
}

struct Flat {
  std::vector<float> data;
  std::vector<int64_t> target;
  bool operator==(const Flat&) const = default;
};

std::vector<Flat> one_pass(DataLoader& loader) {
  std::vector<Flat> out;
  for (Batch& batch : loader) out.push_back({batch.data.tolist<float>(), batch.target.tolist<int64_t>()});
  return out;
}

// Example i is [i] with target i; sleeps `delay(i)` first, throws at `fail_at`.
class Numbers : public Dataset {
 public:
  explicit Numbers(int64_t size, int64_t fail_at = -1, std::function<int(int64_t)> delay_ms = nullptr)
      : size_(size), fail_at_(fail_at), delay_ms_(std::move(delay_ms)) {}
  int64_t size() const override { return size_; }
  Example get(int64_t index, SampleRng&) const override {
    check_index(index, "Numbers");
    if (delay_ms_) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms_(index)));
    if (index == fail_at_) throw std::runtime_error("corrupt record " + std::to_string(index));
    return {full({1}, static_cast<double>(index)), index};
  }

 private:
  int64_t size_, fail_at_;
  std::function<int(int64_t)> delay_ms_;
};

std::vector<int64_t> targets_of(DataLoader& loader) {
  std::vector<int64_t> out;
  for (Batch& batch : loader)
    for (int64_t t : batch.target.tolist<int64_t>()) out.push_back(t);
  return out;
}

}  // namespace

TEST_CASE("batches are identical for num_workers 0, 1 and 3") {
  auto dataset = augmented_dataset(200);
  std::vector<std::vector<Flat>> runs;
  for (int64_t workers : {0, 1, 3}) {
    for (bool persistent : {false, true}) {
      if (workers == 0 && persistent) continue;
      DataLoader loader(dataset, {.batch_size = 32, .shuffle = true, .num_workers = workers,
                                  .persistent_workers = persistent, .seed = 17});
      std::vector<Flat> epochs = one_pass(loader);  // epoch 0
      for (Flat& batch : one_pass(loader)) epochs.push_back(std::move(batch));  // epoch 1
      runs.push_back(std::move(epochs));
    }
  }
  REQUIRE(runs[0].size() == 14);  // 2 epochs x ceil(200 / 32)
  CHECK(runs[0][0].data.size() == 32 * 3 * 32 * 32);
  CHECK(runs[0][6].target.size() == 8);  // 200 = 6 * 32 + 8
  for (size_t r = 1; r < runs.size(); ++r) CHECK(runs[r] == runs[0]);
  CHECK(runs[0][0] != runs[0][7]);  // epoch 1 reshuffles and re-augments
}

TEST_CASE("results arrive in sampler order even when workers finish out of order") {
  // Even-numbered batches are slow, so later batches finish first.
  auto dataset = std::make_shared<Numbers>(40, -1, [](int64_t i) { return (i / 4) % 2 == 0 ? 6 : 0; });
  DataLoader loader(dataset, {.batch_size = 4, .num_workers = 3, .prefetch_factor = 2});
  std::vector<int64_t> expected(40);
  for (int64_t i = 0; i < 40; ++i) expected[static_cast<size_t>(i)] = i;
  CHECK(targets_of(loader) == expected);
  // The default collate stacked [1]-shaped examples into [B, 1].
  for (Batch& batch : loader) {
    CHECK(batch.data.shape() == Shape{4, 1});
    CHECK(batch.data.tolist<float>()[0] == static_cast<float>(batch.target.tolist<int64_t>()[0]));
  }
}

TEST_CASE("len(loader) and drop_last") {
  auto dataset = std::make_shared<Numbers>(10);
  DataLoader keep(dataset, {.batch_size = 3});
  DataLoader drop(dataset, {.batch_size = 3, .num_workers = 2, .drop_last = true});
  CHECK(keep.size() == 4);
  CHECK(drop.size() == 3);
  std::vector<int64_t> sizes;
  for (Batch& batch : keep) sizes.push_back(batch.size());
  CHECK(sizes == std::vector<int64_t>{3, 3, 3, 1});
  CHECK(targets_of(drop) == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8});
  DataLoader tiny(dataset, {.batch_size = 32, .drop_last = true});
  CHECK(tiny.size() == 0);
  CHECK(tiny.begin() == tiny.end());
}

TEST_CASE("epochs advance per pass and set_epoch replays one exactly") {
  auto dataset = augmented_dataset(64);
  DataLoader loader(dataset, {.batch_size = 16, .shuffle = true, .num_workers = 2, .seed = 3});
  std::vector<std::vector<Flat>> passes;
  for (int i = 0; i < 4; ++i) {
    passes.push_back(one_pass(loader));
    CHECK(loader.epoch() == i);
  }
  DataLoader resumed(dataset, {.batch_size = 16, .shuffle = true, .seed = 3});
  resumed.set_epoch(3);
  CHECK(one_pass(resumed) == passes[3]);
  CHECK(one_pass(resumed) == one_pass(loader));  // both now at epoch 4
}

TEST_CASE("an exception in a worker reaches the consumer at its batch, with context") {
  for (int64_t workers : {0, 1, 3}) {
    CAPTURE(workers);
    auto dataset = std::make_shared<Numbers>(40, /*fail_at=*/13);
    DataLoader loader(dataset, {.batch_size = 5, .num_workers = workers});
    std::vector<int64_t> seen;
    std::string message;
    try {
      for (Batch& batch : loader)
        for (int64_t t : batch.target.tolist<int64_t>()) seen.push_back(t);
    } catch (const Error& e) {
      message = e.what();
    }
    CHECK(seen.size() == 10);  // batches 0 and 1 were delivered before batch 2 failed
    CHECK(message.find("batch 2 of 8") != std::string::npos);
    CHECK(message.find("corrupt record 13") != std::string::npos);
    CHECK(message.find("dataset indices [10, 11, 12, 13, 14]") != std::string::npos);
    CHECK(message.find(workers == 0 ? "main thread" : "worker ") != std::string::npos);
    // The loader is usable again, and the failure repeats at the same place.
    CHECK_THROWS_AS(one_pass(loader), Error);
  }
  // A failure far ahead of an abandoned consumer: destruction must not hang.
  auto dataset = std::make_shared<Numbers>(400, /*fail_at=*/30);
  {
    DataLoader loader(dataset, {.batch_size = 5, .num_workers = 3, .prefetch_factor = 4,
                                .persistent_workers = true});
    auto it = loader.begin();
    CHECK(it->size() == 5);
  }
  // An index the dataset refuses is reported the same way.
  DataLoader bad(std::make_shared<Numbers>(400),
                 {.batch_size = 4, .sampler = std::make_shared<SequentialSampler>(401), .num_workers = 2});
  std::string message;
  try {
    (void)one_pass(bad);
  } catch (const Error& e) {
    message = e.what();
  }
  CHECK(message.find("index 400 is out of range") != std::string::npos);
}

TEST_CASE("breaking out of a pass and starting another") {
  auto dataset = std::make_shared<Numbers>(100);
  for (bool persistent : {false, true}) {
    DataLoader loader(dataset, {.batch_size = 10, .num_workers = 2, .persistent_workers = persistent});
    for (Batch& batch : loader) {
      CHECK(batch.target.tolist<int64_t>()[0] == 0);
      break;
    }
    auto stale = loader.begin();
    CHECK(targets_of(loader).size() == 100);  // a full pass after the abandoned ones
    CHECK_THROWS_AS(++stale, Error);          // an iterator of an old pass refuses to go on
  }
}

TEST_CASE("options are validated as PyTorch validates them") {
  auto dataset = std::make_shared<Numbers>(10);
  auto sampler = std::make_shared<SequentialSampler>(10);
  CHECK_THROWS_AS(DataLoader(dataset, {.batch_size = 0}), Error);
  CHECK_THROWS_AS(DataLoader(dataset, {.shuffle = true, .sampler = sampler}), Error);
  CHECK_THROWS_AS(DataLoader(dataset, {.num_workers = -1}), Error);
  CHECK_THROWS_AS(DataLoader(dataset, {.num_workers = 2, .prefetch_factor = 0}), Error);
  CHECK_THROWS_AS(DataLoader(dataset, {.persistent_workers = true}), Error);
  CHECK_THROWS_AS(DataLoader(nullptr, {}), Error);
  CHECK_THROWS_WITH_AS(DataLoader(dataset, {.num_workers = 2000}), doctest::Contains("more threads than loom starts"),
                       Error);
  CHECK_THROWS_WITH_AS(DataLoader(dataset, {.num_workers = 4, .prefetch_factor = int64_t(1) << 40}),
                       doctest::Contains("batches in flight is more than loom holds"), Error);
  CHECK_NOTHROW(DataLoader(dataset, {.num_workers = 0, .pin_memory = true}));
  // Collating examples of different shapes names both.
  class Ragged : public Dataset {
    int64_t size() const override { return 4; }
    Example get(int64_t i, SampleRng&) const override { return {zeros({i + 1}), 0}; }
  };
  DataLoader ragged(std::make_shared<Ragged>(), {.batch_size = 2});
  try {
    (void)one_pass(ragged);
    FAIL("expected an error");
  } catch (const Error& e) {
    std::string message = e.what();
    CHECK(message.find("[2]") != std::string::npos);
    CHECK(message.find("[1]") != std::string::npos);
    CHECK(message.find("torch.stack") != std::string::npos);
  }
}

TEST_CASE("a DistributedSampler drives the loader; set_epoch passes through") {
  auto dataset = std::make_shared<Numbers>(50);
  std::vector<int64_t> everything;
  for (int64_t rank = 0; rank < 4; ++rank) {
    auto sampler = std::make_shared<DistributedSampler>(50, 4, rank, /*shuffle=*/true, /*seed=*/9);
    DataLoader loader(dataset, {.batch_size = 4, .sampler = sampler, .num_workers = 1});
    CHECK(loader.size() == 4);  // 13 samples per rank, batches of 4
    loader.set_epoch(2);
    CHECK(sampler->epoch() == 2);
    std::vector<int64_t> got = targets_of(loader);
    CHECK(got == distributed_indices(50, 4, rank, true, 9, 2, false));
    everything.insert(everything.end(), got.begin(), got.end());
  }
  std::sort(everything.begin(), everything.end());
  CHECK(std::unique(everything.begin(), everything.end()) - everything.begin() == 50);  // all covered
}

TEST_CASE("loader throughput with worker threads") {
  auto dataset = augmented_dataset(8192);
  for (int64_t workers : {0, 1, 2}) {
    DataLoader loader(dataset, {.batch_size = 128, .shuffle = true, .num_workers = workers});
    const auto start = std::chrono::steady_clock::now();
    int64_t images = 0;
    for (Batch& batch : loader) images += batch.size();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    MESSAGE("DataLoader, num_workers=", workers, ": ", static_cast<int64_t>(images / seconds),
            " img/s (augmented CIFAR batches of 128, 2-core machine shared with other builds)");
    CHECK(images == 8192);
  }
}
