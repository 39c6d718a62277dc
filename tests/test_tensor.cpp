// core/: devices, dtypes, shapes, storage, factories, the caching allocator, RNG.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "autograd/ops.h"
#include "core/allocator.h"

using namespace loom;

TEST_CASE("devices parse and print like torch.device") {
  CHECK(Device("cpu") == Device(DeviceType::CPU, 0));
  CHECK(Device("cpu:3").index == 3);
  CHECK(Device("cuda:1").is_cuda());
  CHECK(Device("cuda:1").str() == "cuda:1");
  CHECK_THROWS_WITH_AS(Device("gpu:0"), doctest::Contains("expected 'cpu', 'cpu:N', 'cuda' or 'cuda:N'"), Error);
  CHECK_THROWS_WITH_AS(Device("cpu:x"), doctest::Contains("bad device index"), Error);
  CHECK_THROWS_AS(Device("cpu:-1"), Error);
}

TEST_CASE("dtypes: sizes, names, 16-bit conversions") {
  CHECK(element_size(kFloat32) == 4);
  CHECK(element_size(kInt64) == 8);
  CHECK(element_size(kBFloat16) == 2);
  CHECK(std::string(dtype_name(kFloat64)) == "float64");
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 1e-5f, 3.14159f}) {
    CHECK(static_cast<float>(Half(v)) == doctest::Approx(v).epsilon(1e-3));
    CHECK(static_cast<float>(BFloat16(v)) == doctest::Approx(v).epsilon(1e-2));
  }
  CHECK(static_cast<float>(Half(1e6f)) == std::numeric_limits<float>::infinity());
}

TEST_CASE("shapes: strides, broadcasting, dim wrapping") {
  CHECK(contiguous_strides({2, 3, 4}) == Shape{12, 4, 1});
  CHECK(broadcast_shapes({2, 1, 4}, {3, 1}) == Shape{2, 3, 4});
  CHECK(broadcast_shapes({}, {5}) == Shape{5});
  CHECK_THROWS_WITH_AS(broadcast_shapes({2, 3}, {4, 3}), doctest::Contains("[2, 3] and [4, 3]"), Error);
  CHECK(wrap_dim(-1, 3) == 2);
  CHECK_THROWS_WITH_AS(wrap_dim(3, 3), doctest::Contains("expected in [-3, 2], got 3"), Error);
}

TEST_CASE("factories") {
  CHECK(zeros({2, 2}).tolist<float>() == std::vector<float>{0, 0, 0, 0});
  CHECK(ones({3}, kInt64).tolist<int64_t>() == std::vector<int64_t>{1, 1, 1});
  CHECK(full({2}, 2.5, kFloat64).tolist<double>() == std::vector<double>{2.5, 2.5});
  CHECK(arange(5).tolist<int64_t>() == std::vector<int64_t>{0, 1, 2, 3, 4});
  CHECK(arange(1, 2, 0.25, kFloat32).tolist<float>() == std::vector<float>{1, 1.25f, 1.5f, 1.75f});
  CHECK(from_vector<int32_t>({1, 2, 3, 4}, {2, 2}).shape() == Shape{2, 2});
  CHECK_THROWS_WITH_AS(from_vector<float>({1, 2, 3}, {2, 2}), doctest::Contains("3 values cannot fill shape [2, 2]"), Error);
  CHECK(scalar_tensor(4).item<float>() == 4);
  CHECK(empty({2, 3}, TensorOptions(kFloat64).device("cpu:2")).device() == Device("cpu:2"));
  CHECK(zeros({2}, TensorOptions().requires_grad()).requires_grad());
  CHECK_THROWS_AS(empty({-1}), Error);
  CHECK_THROWS_WITH_AS(ones({2}).item<float>(), doctest::Contains("one element"), Error);
  CHECK_THROWS_WITH_AS(ones({2}).data_ptr<double>(), doctest::Contains("float32"), Error);
}

TEST_CASE("random tensors are reproducible per seed and independent of thread count") {
  Generator g1(42), g2(42), g3(43);
  Tensor a = randn({1000}, {}, &g1), b = randn({1000}, {}, &g2), c = randn({1000}, {}, &g3);
  CHECK(a.tolist<float>() == b.tolist<float>());
  CHECK(a.tolist<float>() != c.tolist<float>());
  // Successive draws differ; the generator's state is (seed, offset).
  Tensor a2 = randn({1000}, {}, &g1);
  CHECK(a2.tolist<float>() != a.tolist<float>());
  CHECK(g1.offset() == 2000);
  // Moments of a large draw.
  Generator g(7);
  Tensor n = randn({200000}, kFloat64, &g);
  CHECK(n.mean().item<double>() == doctest::Approx(0).epsilon(0.02).scale(1));
  CHECK(n.var({0}).item<double>() == doctest::Approx(1).epsilon(0.02));
  Tensor u = rand({200000}, kFloat64, &g);
  CHECK(u.min().item<double>() >= 0);
  CHECK(u.max().item<double>() < 1);
  CHECK(u.mean().item<double>() == doctest::Approx(0.5).epsilon(0.01));
  Tensor r = randint(3, 7, {10000}, kInt64, &g);
  CHECK(r.min().item<int64_t>() == 3);
  CHECK(r.max().item<int64_t>() == 6);
  auto perm = randperm(100, &g).tolist<int64_t>();
  std::sort(perm.begin(), perm.end());
  for (int64_t i = 0; i < 100; ++i) CHECK(perm[static_cast<size_t>(i)] == i);
  manual_seed(5);
  auto first = rand({4}).tolist<float>();
  manual_seed(5);
  CHECK(rand({4}).tolist<float>() == first);
}

TEST_CASE("the caching allocator reuses freed blocks") {
  Device cpu;
  empty_cache(DeviceType::CPU);
  AllocatorStats before = memory_stats(cpu);
  { Tensor t = empty({1 << 20}); }
  AllocatorStats mid = memory_stats(cpu);
  CHECK(mid.system_allocations == before.system_allocations + 1);
  for (int i = 0; i < 10; ++i) { Tensor t = empty({1 << 20}); }
  AllocatorStats after = memory_stats(cpu);
  CHECK(after.system_allocations == mid.system_allocations);  // served from the cache
  CHECK(after.allocated_bytes == before.allocated_bytes);
  CHECK(after.peak_allocated_bytes >= before.allocated_bytes + (4 << 20));
  empty_cache(DeviceType::CPU);
  CHECK(memory_stats(cpu).reserved_bytes == memory_stats(cpu).allocated_bytes);
  CHECK_THROWS_WITH_AS(empty({2}, Device("cuda:0")), doctest::Contains("cuda"), Error);
}

TEST_CASE("the caching allocator serves a request from a cached block up to twice its size") {
  Device cpu;
  empty_cache(DeviceType::CPU);
  const int64_t four_mib = 1 << 20;  // float32 elements
  { Tensor t = empty({four_mib}); }   // one 4 MiB block, now cached
  AllocatorStats start = memory_stats(cpu);
  {
    Tensor t = empty({four_mib * 5 / 8});  // 2.5 MiB: takes the cached 4 MiB block
    CHECK(memory_stats(cpu).system_allocations == start.system_allocations);
    CHECK(memory_stats(cpu).allocated_bytes == start.allocated_bytes + 4 * four_mib);  // whole blocks
    Tensor small = empty({four_mib / 4});  // 1 MiB: a 4 MiB block would waste too much
    CHECK(memory_stats(cpu).system_allocations == start.system_allocations + 1);
  }
  { Tensor t = empty({four_mib}); }  // the 4 MiB block went back under its own size
  CHECK(memory_stats(cpu).system_allocations == start.system_allocations + 1);
  CHECK(memory_stats(cpu).allocated_bytes == start.allocated_bytes);
  empty_cache(DeviceType::CPU);
  CHECK(memory_stats(cpu).reserved_bytes == memory_stats(cpu).allocated_bytes);
}

TEST_CASE("printing") {
  Tensor t = from_vector<float>({1, 2}, {2});
  CHECK(t.str() == "Tensor[float32, [2], cpu:0]");
  std::ostringstream out;
  out << t;
  CHECK(out.str().find("{1, 2}") != std::string::npos);
  CHECK(Tensor().str() == "Tensor[undefined]");
  CHECK_THROWS_WITH_AS(Tensor().shape(), doctest::Contains("undefined"), Error);
}

TEST_CASE("sizes that would overflow, and dims of a 0-d tensor, are errors, not reads past the storage") {
  const int64_t huge = 6148914691236517206;  // 9 * huge wraps around int64
  CHECK_THROWS_WITH_AS(ones({9, huge}), doctest::Contains("more elements than an int64 can count"), Error);
  CHECK_THROWS_WITH_AS(ones({1, 1}).expand({9, huge}).contiguous(), doctest::Contains("more elements than"), Error);
  CHECK_THROWS_WITH_AS(zeros({int64_t(1) << 62}), doctest::Contains("more bytes than a size_t can count"), Error);
  Tensor s = scalar_tensor(1.0);
  CHECK_THROWS_WITH_AS(s.size(0), doctest::Contains("a 0-d tensor (a scalar) has no dimensions, got dim 0"), Error);
  CHECK_THROWS_WITH_AS(s.stride(-1), doctest::Contains("has no dimensions"), Error);
  CHECK_THROWS_WITH_AS(s.select(0, 0), doctest::Contains("has no dimensions"), Error);
  CHECK_THROWS_WITH_AS(s.narrow(0, 0, 1), doctest::Contains("has no dimensions"), Error);
  // Reductions and squeeze take dim 0 or -1 of a scalar, as PyTorch's: the scalar itself.
  CHECK(sum(s).item<float>() == 1.0f);
  CHECK(sum(s, {0}).item<float>() == 1.0f);
  CHECK(max(s, -1).first.item<float>() == 1.0f);
  CHECK(argmax(s, 0).item<int64_t>() == 0);
  CHECK(s.squeeze(0).dim() == 0);
  CHECK_THROWS_WITH_AS(sum(s, {1}), doctest::Contains("takes dim 0 or -1 here, got 1"), Error);
}

TEST_CASE("a scalar an integer tensor cannot hold exactly is refused, not truncated") {
  Tensor i = full({3}, 7, TensorOptions(kInt64));
  CHECK((i + 2.0).tolist<int64_t>() == std::vector<int64_t>{9, 9, 9});
  CHECK_THROWS_WITH_AS(i + 0.5, doctest::Contains("the scalar 0.5 is not a value of int64"), Error);
  CHECK_THROWS_WITH_AS(i * 2.5, doctest::Contains("convert first, e.g. x.to(kFloat32)"), Error);
  CHECK_THROWS_WITH_AS(add(i, i, 0.5), doctest::Contains("alpha: the scalar 0.5"), Error);
  CHECK_THROWS_WITH_AS(full({2}, std::nan(""), TensorOptions(kInt64)), doctest::Contains("full: the scalar nan"), Error);
  CHECK_THROWS_WITH_AS(full({2}, 1e30, TensorOptions(kInt32)), doctest::Contains("is not a value of int32"), Error);
  CHECK_THROWS_WITH_AS(full({2}, 256, TensorOptions(kUInt8)), doctest::Contains("is not a value of uint8"), Error);
  CHECK(full({2}, 255, TensorOptions(kUInt8)).tolist<uint8_t>() == std::vector<uint8_t>{255, 255});
  CHECK(full({1}, 0.5, TensorOptions(kBool)).item<bool>());  // nonzero is true, as in PyTorch
  // Division of integers is true division in PyTorch (floats): refused rather than
  // truncated, or crashing on a zero divisor.
  CHECK_THROWS_WITH_AS(i / zeros({3}, TensorOptions(kInt64)), doctest::Contains("div: dividing int64 tensors"), Error);
  CHECK_THROWS_WITH_AS(i / 2.0, doctest::Contains("PyTorch's division of integers gives floats"), Error);
}

TEST_CASE("arange refuses what it would truncate or could never finish") {
  CHECK(arange(0, 1, 0.25, kFloat32).tolist<float>() == std::vector<float>{0, 0.25f, 0.5f, 0.75f});
  CHECK_THROWS_WITH_AS(arange(0, 1, 0.3), doctest::Contains("pass a floating dtype, e.g. arange(0, 1, 0.3, kFloat32)"),
                       Error);
  CHECK_THROWS_WITH_AS(arange(0, INFINITY, 1, kFloat32), doctest::Contains("must be finite"), Error);
  CHECK(arange(0, 6, 2).tolist<int64_t>() == std::vector<int64_t>{0, 2, 4});
}

TEST_CASE("in-place forms check their scalars too; an empty expanded tensor writes nothing and is fine") {
  Tensor i = full({2}, 1, TensorOptions(kInt64));
  CHECK_THROWS_WITH_AS(i.add_(i.clone(), 0.5), doctest::Contains("add_: alpha: the scalar 0.5"), Error);
  CHECK_THROWS_WITH_AS(i.fill_(std::nan("")), doctest::Contains("fill_: the scalar nan"), Error);
  CHECK(i.tolist<int64_t>() == std::vector<int64_t>{1, 1});
  Tensor empty_expanded = zeros({0}).expand({0, 0});
  CHECK_NOTHROW(empty_expanded.fill_(1));
}
