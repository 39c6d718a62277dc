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

TEST_CASE("an empty limit list is an error") {
  CHECK_THROWS_AS(compute_bucket_assignment_by_size({floats(1)}, {}), Error);
}
