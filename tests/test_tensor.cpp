// core/: devices, dtypes, shapes, storage, factories, the caching allocator, RNG.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <vector>

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

namespace {

constexpr int64_t kMiB = 1 << 20;

// `bytes` (a multiple of 4) of float32 on `device`. Each test case below uses a virtual CPU
// device of its own, whose cache and counts no other case touches.
Tensor block(int64_t bytes, Device device) { return empty({bytes / 4}, TensorOptions().device(device)); }

}  // namespace

TEST_CASE("the caching allocator reuses freed blocks, and empty_cache returns them") {
  const Device device("cpu:11");
  { Tensor t = block(4 * kMiB, device); }
  const AllocatorStats mid = memory_stats(device);
  CHECK(mid.system_allocations == 1);
  CHECK(mid.reserved_bytes == 4 * kMiB);  // a segment of the request's size, kept
  for (int i = 0; i < 10; ++i) { Tensor t = block(4 * kMiB, device); }
  const AllocatorStats after = memory_stats(device);
  CHECK(after.system_allocations == 1);  // served from the cache
  CHECK(after.allocated_bytes == 0);
  CHECK(after.peak_allocated_bytes == 4 * kMiB);
  Tensor held = block(64, device);  // a small block: a 2 MiB segment of the small pool
  CHECK(memory_stats(device).reserved_bytes == 6 * kMiB);
  empty_cache(DeviceType::CPU);
  CHECK(memory_stats(device).reserved_bytes == 2 * kMiB);  // the free segment went back; the one in use stays
  CHECK(memory_stats(device).allocated_bytes == 512);     // sizes round up to 512 bytes
  CHECK_THROWS_WITH_AS(empty({2}, Device("cuda:0")), doctest::Contains("cuda"), Error);
}

TEST_CASE("the caching allocator splits a cached block for smaller requests, and the pieces merge again") {
  const Device device("cpu:12");
  { Tensor t = block(4 * kMiB, device); }  // one 4 MiB segment, now free
  {
    Tensor a = block(5 * kMiB / 2, device);  // 2.5 MiB of it; 1.5 MiB stays cached
    Tensor b = block(3 * kMiB / 2, device);  // the other 1.5 MiB
    CHECK(memory_stats(device).system_allocations == 1);
    CHECK(memory_stats(device).allocated_bytes == 4 * kMiB);
    CHECK(static_cast<char*>(b.raw_data()) == static_cast<char*>(a.raw_data()) + 5 * kMiB / 2);
    Tensor small = block(4096, device);  // small requests never split a large segment
    CHECK(memory_stats(device).system_allocations == 2);
  }
  // Freed, the three pieces are one 4 MiB block again: a 4 MiB request needs no new segment.
  { Tensor t = block(4 * kMiB, device); }
  CHECK(memory_stats(device).system_allocations == 2);
  CHECK(memory_stats(device).reserved_bytes == 6 * kMiB);
}

TEST_CASE("a request nothing cached fits returns the segments too small for it, longest idle first") {
  const Device device("cpu:13");
  const void* last = nullptr;
  {
    Tensor a = block(2 * kMiB, device), b = block(2 * kMiB, device), c = block(2 * kMiB, device);
    last = c.raw_data();
    a = Tensor();  // idle first
    b = Tensor();
    c = Tensor();  // idle last
  }
  CHECK(memory_stats(device).reserved_bytes == 6 * kMiB);
  // 3 MiB fits none of the 2 MiB segments: a and b (4 MiB, the new segment's size) go back first.
  Tensor big = block(3 * kMiB, device);
  CHECK(memory_stats(device).reserved_bytes == 2 * kMiB + 4 * kMiB);
  CHECK(memory_stats(device).system_allocations == 4);
  Tensor again = block(2 * kMiB, device);  // c stayed cached
  CHECK(memory_stats(device).system_allocations == 4);
  CHECK(again.raw_data() == last);
}

TEST_CASE("an oversize block (over 256 MiB) is never split, serves oversize requests only, and stays for them") {
  const Device device("cpu:15");  // mapped, never touched: no resident memory
  { Tensor t = block(300 * kMiB, device); }  // one oversize segment, now free
  {
    Tensor small = block(8 * kMiB, device);  // not carved out of it: a segment of its own
    CHECK(memory_stats(device).system_allocations == 2);
  }
  {
    Tensor big = block(280 * kMiB, device);  // served by the oversize block, whole
    CHECK(memory_stats(device).system_allocations == 2);
    CHECK(memory_stats(device).allocated_bytes == 300 * kMiB);
  }
  // 20 MiB fits no block it may take: the idle 8 MiB segment goes back, the oversize one stays.
  Tensor mid = block(20 * kMiB, device);
  CHECK(memory_stats(device).system_allocations == 3);
  CHECK(memory_stats(device).reserved_bytes == 320 * kMiB);
}

TEST_CASE("a repeating step reaches a steady state: no system allocation, less cached than a cache per size") {
  const Device device("cpu:14");
  // A step as a net makes them: activations of falling sizes kept for the backward, their
  // gradients made while they are freed, and temporaries of other sizes in between.
  const std::vector<int64_t> sizes = {8 * kMiB, 6 * kMiB, 3 * kMiB, 2 * kMiB, kMiB, 256 * 1024};
  std::map<int64_t, std::pair<int, int>> count;  // size -> (live now, most live at once)
  const auto make = [&](int64_t size) {
    auto& [live, most] = count[size];
    most = std::max(most, ++live);
    return std::shared_ptr<Tensor>(new Tensor(block(size, device)), [&count, size](Tensor* t) {
      --count[size].first;
      delete t;
    });
  };
  const auto step = [&] {
    std::vector<std::shared_ptr<Tensor>> activations;
    for (int64_t size : sizes) {
      auto temporary = make(size / 2);
      activations.push_back(make(size));
    }
    for (size_t i = activations.size(); i-- > 0;) {
      auto gradient = make(sizes[i]);
      auto temporary = make(sizes[i] * 3 / 2);
      activations[i].reset();
    }
  };
  int64_t system_allocations = 0;
  for (int i = 0; i < 6; ++i) {
    step();
    if (i == 2) system_allocations = memory_stats(device).system_allocations;
  }
  const AllocatorStats stats = memory_stats(device);
  CHECK(stats.system_allocations == system_allocations);
  // A cache of whole blocks per size holds each size's most live at once; splitting and
  // merging hold less (Note [Caching allocator]).
  int64_t per_size = 0;
  for (const auto& [size, live] : count) per_size += size * live.second;
  INFO("reserved ", stats.reserved_bytes, ", per size ", per_size, ", peak allocated ", stats.peak_allocated_bytes);
  CHECK(stats.reserved_bytes < per_size * 3 / 4);
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
