// Device memory budget (core/memory.h): a cap on a device's reserved bytes, PyTorch's
// OutOfMemoryError report, the cache freed and the allocation retried once before it is
// raised, and the per-device statistics. Each test case uses a virtual CPU device of its
// own (cpu:3 ... cpu:7), so its counts start at zero whatever ran before.
#include <doctest/doctest.h>

#include <string>

#include "core/factory.h"  // defines: zeros
#include "core/memory.h"   // defines: set_device_memory_limit, OutOfMemoryError, memory_allocated, ...
#include "nn/resnet.h"     // defines: resnet_tiny

using namespace loom;

namespace {

constexpr int64_t kMiB = 1 << 20;

// `bytes` (a multiple of 4) of float32 on `device`: a segment of exactly that size when it
// is a multiple of 2 MiB and nothing cached fits it (Note [Caching allocator]).
Tensor block(int64_t bytes, Device device) { return zeros({bytes / 4}, TensorOptions().device(device)); }

// Lifts the budget when a test case ends, passed or failed.
struct LimitGuard {
  Device device;
  LimitGuard(int64_t bytes, Device d) : device(d) { set_device_memory_limit(bytes, device); }
  ~LimitGuard() {
    set_device_memory_limit(kNoMemoryLimit, device);
    empty_cache(DeviceType::CPU);
  }
};

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("an allocation that just fits the limit succeeds; one past it raises OutOfMemoryError with PyTorch's report") {
  const Device device("cpu:7");
  LimitGuard limit(4 * kMiB, device);
  Tensor fits = block(4 * kMiB, device);  // reserved == limit exactly
  CHECK(memory_reserved(device) == 4 * kMiB);
  CHECK(memory_allocated(device) == 4 * kMiB);
  std::string report;
  try {
    block(64, device);
  } catch (const OutOfMemoryError& e) {
    report = e.what();
  }
  INFO(report);
  CHECK(contains(report, "CPU out of memory. Tried to allocate 64 bytes. Device cpu:7 has a total capacity of "));
  CHECK(contains(report, " GiB of which "));
  CHECK(contains(report, " is free. 4.00 MiB allowed (set_per_process_memory_fraction / set_device_memory_limit); "));
  CHECK(contains(report, "Of the allocated memory 4.00 MiB is allocated by loom, and 0 bytes is reserved by loom but "
                         "unallocated."));
  CHECK(contains(report, "FSDP shards parameters"));  // what to try
  const AllocatorStats stats = memory_stats(device);
  CHECK(stats.num_ooms == 1);
  CHECK(stats.num_alloc_retries == 1);  // the cache (empty here) was freed and the allocation retried first
  // An OutOfMemoryError is a loom::Error, so code that catches those sees it too.
  CHECK_THROWS_AS(block(64, device), Error);
  CHECK(memory_stats(device).num_ooms == 2);
  // Other devices have their own budget (none).
  CHECK(block(8 * kMiB, Device("cpu:6")).numel() == 2 * kMiB);
}

TEST_CASE("past the limit, the device's cache is freed and the allocation retried once before raising") {
  const Device device("cpu:5");
  LimitGuard limit(8 * kMiB, device);
  block(4 * kMiB, device);  // freed at once: a cached 4 MiB block
  CHECK(memory_reserved(device) == 4 * kMiB);
  CHECK(memory_allocated(device) == 0);
  // 8 MiB does not fit beside the cached 4 MiB, and the cached block is too small to serve
  // it: the cache goes back to the system and the retry fits.
  Tensor big = block(8 * kMiB, device);
  AllocatorStats stats = memory_stats(device);
  CHECK(stats.num_alloc_retries == 1);
  CHECK(stats.num_ooms == 0);
  CHECK(stats.reserved_bytes == 8 * kMiB);
  // Nothing cached to free now: the retry cannot help, and the error reports what is held.
  std::string report;
  try {
    block(4 * kMiB, device);
  } catch (const OutOfMemoryError& e) {
    report = e.what();
  }
  CHECK(contains(report, "Tried to allocate 4.00 MiB"));
  CHECK(contains(report, "8.00 MiB allowed"));
  CHECK(contains(report, "Of the allocated memory 8.00 MiB is allocated by loom"));
  stats = memory_stats(device);
  CHECK(stats.num_alloc_retries == 2);
  CHECK(stats.num_ooms == 1);
  // A cache hit needs no new reservation, so it succeeds at the limit.
  big = Tensor();
  CHECK(block(8 * kMiB, device).numel() == 2 * kMiB);
  CHECK(memory_stats(device).num_ooms == 1);
}

TEST_CASE("statistics are per device: allocated, reserved, their peaks, reset_peak_memory_stats, memory_summary") {
  const Device device("cpu:4");
  const int64_t other_before = memory_allocated(Device("cpu:3"));
  {
    Tensor a = block(2 * kMiB, device);
    {
      Tensor b = block(4 * kMiB, device);
      CHECK(memory_allocated(device) == 6 * kMiB);
    }
    CHECK(memory_allocated(device) == 2 * kMiB);
    CHECK(max_memory_allocated(device) == 6 * kMiB);
    CHECK(memory_reserved(device) == 6 * kMiB);  // b's block is cached
    reset_peak_memory_stats(device);
    CHECK(max_memory_allocated(device) == 2 * kMiB);
    CHECK(max_memory_reserved(device) == 6 * kMiB);
  }
  CHECK(memory_allocated(Device("cpu:3")) == other_before);
  const std::string summary = memory_summary(device);
  INFO(summary);
  CHECK(contains(summary, "loom memory summary, device cpu:4"));
  CHECK(contains(summary, "OOMs: 0"));
  CHECK(contains(summary, "limit: none"));
  CHECK(contains(summary, "| Allocated memory                  |           0 bytes |          2.00 MiB |"));
  CHECK(contains(summary, "| Reserved memory                   |          6.00 MiB |          6.00 MiB |"));
  empty_cache(DeviceType::CPU);
  CHECK(memory_reserved(device) == 0);
}

TEST_CASE("set_per_process_memory_fraction: a share of the device's capacity, in [0, 1]") {
  const Device device("cpu:3");
  LimitGuard none(kNoMemoryLimit, device);
  CHECK(device_memory_limit(device) == kNoMemoryLimit);
  set_per_process_memory_fraction(0.25, device);
  CHECK(device_memory_limit(device) == device_memory_capacity(device) / 4);
  CHECK(device_memory_capacity(device) > device_memory_free(device) / 2);
  CHECK_THROWS_WITH_AS(set_per_process_memory_fraction(1.5, device),
                       doctest::Contains("invalid fraction value: 1.5. Allowed range: 0~1"), Error);
  CHECK_THROWS_WITH_AS(set_device_memory_limit(-5, device), doctest::Contains("expected a number of bytes >= 0"), Error);
}

TEST_CASE("a model that does not fit its device's budget fails in forward with the report; lifting the budget trains it") {
  const Device device("cpu:3");
  auto model = nn::resnet_tiny(10, 8);
  model->to(device);
  Tensor images = zeros({32, 3, 32, 32}, TensorOptions().device(device));
  {
    LimitGuard limit(memory_reserved(device) + 2 * kMiB, device);  // the weights, and 2 MiB of activations
    CHECK_THROWS_WITH_AS((*model)(images), doctest::Contains("CPU out of memory. Tried to allocate"), OutOfMemoryError);
  }
  CHECK((*model)(images).size(0) == 32);
}

TEST_CASE("parse_memory_size and format_memory_size: the --device-memory-limit forms and PyTorch's report sizes") {
  CHECK(parse_memory_size("1.5GiB") == 1536 * kMiB);
  CHECK(parse_memory_size("512MiB") == 512 * kMiB);
  CHECK(parse_memory_size("2 GB") == 2'000'000'000);
  CHECK(parse_memory_size("64KiB") == 65536);
  CHECK(parse_memory_size("1000") == 1000);
  CHECK_THROWS_WITH_AS(parse_memory_size("lots"), doctest::Contains("expected a memory size such as 1.5GiB"), Error);
  CHECK_THROWS_WITH_AS(parse_memory_size("1.5Gb"), doctest::Contains("got '1.5Gb'"), Error);
  CHECK(format_memory_size(512) == "512 bytes");
  CHECK(format_memory_size(20 * kMiB) == "20.00 MiB");
  CHECK(format_memory_size(1536 * kMiB) == "1.50 GiB");
}

TEST_CASE("reserve_external_memory: memory the allocator did not hand out counts, against the budget, until released") {
  const Device device("cpu:6");
  const int64_t before = memory_allocated(device), reserved_before = memory_reserved(device);
  std::shared_ptr<void> charge = reserve_external_memory(3 * kMiB, device);
  CHECK(memory_allocated(device) == before + 3 * kMiB);
  CHECK(memory_reserved(device) == reserved_before + 3 * kMiB);
  {
    LimitGuard limit(memory_reserved(device) + kMiB, device);
    CHECK_THROWS_WITH_AS(reserve_external_memory(2 * kMiB, device), doctest::Contains("Tried to allocate 2.00 MiB"),
                         OutOfMemoryError);
    CHECK_NOTHROW(reserve_external_memory(kMiB, device));  // just fits; released at once
  }
  charge.reset();
  CHECK(memory_allocated(device) == before);
}
