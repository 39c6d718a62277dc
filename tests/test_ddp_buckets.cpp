// DDP bucket assignment is a pure function of parameter sizes (Note [Bucket order]).
#include <doctest/doctest.h>

#include "parallel/ddp/bucket_assignment.h"

using namespace loom;
using loom::ddp::compute_bucket_assignment_by_size;
using loom::ddp::ParameterInfo;

namespace {
ParameterInfo floats(int64_t n, DType dtype = kFloat32, Device device = Device()) { return {n, dtype, device}; }
}  // namespace

TEST_CASE("buckets fill in reverse registration order; the first is small") {
  // Four 1 KiB float32 parameters (256 elements each), first limit 2 KiB, then 3 KiB.
  std::vector<ParameterInfo> params(4, floats(256));
  auto buckets = compute_bucket_assignment_by_size(params, {2048, 3072});
  REQUIRE(buckets.size() == 2);
  CHECK(buckets[0] == std::vector<size_t>{3, 2});  // the last-registered come first
  CHECK(buckets[1] == std::vector<size_t>{1, 0});  // 2 KiB < 3 KiB: closes as a leftover
}

TEST_CASE("a parameter larger than the limit gets a bucket of its own") {
  std::vector<ParameterInfo> params = {floats(10), floats(10000), floats(10)};
  auto buckets = compute_bucket_assignment_by_size(params, {100});
  REQUIRE(buckets.size() == 2);
  CHECK(buckets[0] == std::vector<size_t>{2, 1});
  CHECK(buckets[1] == std::vector<size_t>{0});
}

TEST_CASE("dtypes and devices never share a bucket") {
  std::vector<ParameterInfo> params = {floats(4), floats(4, kFloat64), floats(4), floats(4, kFloat32, Device("cpu:1"))};
  auto buckets = compute_bucket_assignment_by_size(params, {1 << 20});
  REQUIRE(buckets.size() == 3);
  CHECK(buckets[0] == std::vector<size_t>{3});     // cpu:1 float32
  CHECK(buckets[1] == std::vector<size_t>{2, 0});  // cpu:0 float32
  CHECK(buckets[2] == std::vector<size_t>{1});     // float64
}

TEST_CASE("ResNet18-sized parameters with the default limits") {
  // 11.17 M float32 parameters = 42.6 MiB: a 1 MiB first bucket, then 25 MiB buckets.
  std::vector<ParameterInfo> params;
  int64_t total = 0;
  for (int i = 0; i < 62; ++i) {
    int64_t n = i % 3 == 0 ? 512 * 512 * 9 / 4 : 512;
    params.push_back(floats(n));
    total += n;
  }
  auto buckets = compute_bucket_assignment_by_size(params, {ddp::kDefaultFirstBucketBytes, ddp::kDefaultBucketCapBytes});
  size_t assigned = 0;
  std::vector<bool> seen(params.size(), false);
  for (const auto& bucket : buckets) {
    for (size_t index : bucket) {
      CHECK_FALSE(seen[index]);
      seen[index] = true;
      ++assigned;
    }
  }
  CHECK(assigned == params.size());
  int64_t first_bytes = 0;
  for (size_t index : buckets[0]) first_bytes += params[index].numel * 4;
  CHECK(first_bytes >= int64_t(ddp::kDefaultFirstBucketBytes));
  CHECK(first_bytes - params[buckets[0].back()].numel * 4 < int64_t(ddp::kDefaultFirstBucketBytes));
  CHECK(buckets[0].front() == params.size() - 1);
}

TEST_CASE("a small last bucket: the first-registered parameters are split off, one at least") {
  using loom::ddp::split_last_bucket;
  // Five 1 KiB parameters in one 5 KiB bucket: the last limit of 2 KiB takes 1 and 0.
  std::vector<ParameterInfo> params(5, floats(256));
  auto split = split_last_bucket({{4, 3, 2, 1, 0}}, params, 2048);
  CHECK(split == std::vector<std::vector<size_t>>{{4, 3, 2}, {1, 0}});
  // Only the last bucket is split; earlier ones are left as they are.
  CHECK(split_last_bucket({{4, 3}, {2, 1, 0}}, params, 1024) == std::vector<std::vector<size_t>>{{4, 3}, {2, 1}, {0}});
  // Small enough already: unchanged.
  CHECK(split_last_bucket({{4, 3}, {2, 1, 0}}, params, 4096) == std::vector<std::vector<size_t>>{{4, 3}, {2, 1, 0}});
  // A first parameter larger than the limit still ends alone in the last bucket.
  std::vector<ParameterInfo> big_first = {floats(10000), floats(10), floats(10)};
  CHECK(split_last_bucket({{2, 1, 0}}, big_first, 100) == std::vector<std::vector<size_t>>{{2, 1}, {0}});
  // A single-parameter bucket cannot be split.
  CHECK(split_last_bucket({{0}}, big_first, 100) == std::vector<std::vector<size_t>>{{0}});
  CHECK(split_last_bucket({}, big_first, 100).empty());
}

TEST_CASE("ResNet18: the last bucket holds only the first layers, at most 1 MiB") {
  // conv1, bn1 and layer1 (4 convs of 64x64x3x3 and their BatchNorms), then bigger layers.
  std::vector<ParameterInfo> params = {floats(64 * 3 * 9), floats(64), floats(64)};
  for (int conv = 0; conv < 4; ++conv)
    for (int64_t n : {int64_t(64 * 64 * 9), int64_t(64), int64_t(64)}) params.push_back(floats(n));
  for (int conv = 0; conv < 4; ++conv)
    for (int64_t n : {int64_t(128 * 128 * 9), int64_t(128), int64_t(128)}) params.push_back(floats(n));
  auto buckets = split_last_bucket(
      compute_bucket_assignment_by_size(params, {ddp::kDefaultFirstBucketBytes, ddp::kDefaultBucketCapBytes}), params,
      ddp::kDefaultFirstBucketBytes);
  int64_t last_bytes = 0;
  for (size_t i : buckets.back()) last_bytes += params[i].numel * 4;
  CHECK(last_bytes <= int64_t(ddp::kDefaultFirstBucketBytes));
  CHECK(buckets.back().back() == 0);  // conv1.weight, the very last gradient
  CHECK(buckets.size() >= 2);
}

TEST_CASE("an empty limit list is an error") {
  CHECK_THROWS_AS(compute_bucket_assignment_by_size({floats(1)}, {}), Error);
}
