// The CUDA backend (cuda/): which kernels it registers, transfers, the caching allocator,
// streams and events, and the errors a machine without a GPU gives. Each kernel against
// the CPU backend: tests/test_cuda_kernels.cpp; layers, losses, training: test_cuda_nn.cpp.
//
// Without a GPU (or in a -Dcuda=disabled build) the GPU cases are *skipped* -- they
// show in doctest's "skipped" count, and the case "CUDA availability" prints why --
// while the no-GPU error cases and the host-side random-number check run.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "device_compare.h"  // defines: kCuda0, to_device, gpu_empty, check_close, random_cpu
#include "core/allocator.h"
#include "core/copy.h"
#include "core/factory.h"
#include "core/memory.h"  // defines: set_device_memory_limit, OutOfMemoryError, memory_reserved
#include "core/kernels.h"
#include "cuda/caching_allocator.h"  // defines: record_stream
#include "cuda/device.h"             // defines: is_available, Stream, Event, StreamGuard
#include "cuda/random.h"             // defines: device_random_bits_on_host
#include "nn/optim/sgd.h"            // declares: sgd_update_kernel

using namespace loom;

using namespace loom::testing;

namespace {

// Whether a shared object whose path contains `name` is mapped into this process.
bool library_mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find(name) != std::string::npos) return true;
  }
  return false;
}

// Read at static initialisation, after libloom's own (its registrars have run), before
// any test can have touched CUDA. See Note [Why cuBLAS is loaded lazily].
const bool kCublasMappedAtLoad = library_mapped("libcublas");

// Evaluated at static initialisation, before the TEST_CASEs below register (same
// translation unit, so in order), so that the skip decorators can read it.
const bool kGpu = cuda::is_available();

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

// ---- every build, every machine ------------------------------------------------------------

TEST_CASE("CUDA availability") {
  CHECK(cuda::is_available() == (cuda::device_count() > 0));
  if (!kGpu) {
    CHECK(!cuda::unavailable_reason().empty());
    MESSAGE("GPU test cases are skipped: ", cuda::unavailable_reason());
  } else {
    MESSAGE(cuda::device_count(), " CUDA device(s) visible");
  }
}

TEST_CASE("without a GPU, CUDA tensors are a clear loom::Error, not a crash" * doctest::skip(kGpu)) {
  const std::string expected = cuda::is_compiled() ? "no CUDA device is available" : "built without CUDA";
  auto check_error = [&](const std::string& what, auto&& make) {
    std::string message;
    try {
      make();
    } catch (const loom::Error& e) {
      message = e.what();
    }
    INFO(what, " threw: '", message, "'");
    CHECK(contains(message, expected));
  };
  try {
    (void)empty({2, 3}, TensorOptions().device(Device("cuda:0")));
  } catch (const loom::Error& e) {
    MESSAGE("empty({2, 3}, cuda:0) says: ", std::string(e.what()));
  }
  check_error("empty on cuda:0", [] { (void)empty({2, 3}, TensorOptions().device(Device("cuda:0"))); });
  check_error("zeros on cuda:1", [] { (void)zeros({4}, TensorOptions().device(Device("cuda:1"))); });
  check_error("randn on cuda", [] { (void)randn({4}, TensorOptions().device(Device("cuda"))); });
  check_error("to(cuda)", [] { (void)ones({2}).to(Device("cuda:0")); });
  check_error("memory_stats(cuda:0)", [] { (void)memory_stats(Device("cuda:0")); });
  check_error("current_stream()", [] { (void)cuda::current_stream(); });
  check_error("DeviceGuard", [] { cuda::DeviceGuard guard(0); });
  // Nothing above may have broken the CPU.
  CHECK(ones({3}).sum().item<float>() == 3.0f);
}

TEST_CASE("the device copy of random_bits equals core/generator.h's" * doctest::skip(!cuda::is_compiled())) {
  // See Note [Same numbers on every device] (cuda/random.cu): this runs on the host, so
  // it guards the copy on every machine that builds the CUDA backend.
  for (uint64_t seed : {0ull, 1ull, 0x5eedull, 0xffffffffffffffffull, 1234567890123ull}) {
    for (uint64_t i = 0; i < 2000; ++i) {
      const uint64_t counter = i * 0x9E3779B97F4A7C15ull + (i & 7);
      REQUIRE(cuda::device_random_bits_on_host(seed, counter) == random_bits(seed, counter));
      REQUIRE(cuda::device_random_uniform_on_host(seed, counter) == random_uniform(seed, counter));
    }
  }
}

TEST_CASE("loading loom maps no cuBLAS: it is dlopen()ed by the first GPU matmul" * doctest::skip(!cuda::is_compiled())) {
  // This build links the CUDA runtime, so the check below is not vacuous.
  REQUIRE(library_mapped("libcudart"));
  CHECK_FALSE(kCublasMappedAtLoad);
  CHECK_FALSE(library_mapped("libcublasLt"));
  if (!kGpu) CHECK_FALSE(library_mapped("libcublas"));  // nothing here can have loaded it
}

TEST_CASE("every kernel with a CPU implementation has a CUDA one" * doctest::skip(!cuda::is_compiled())) {
  // kernel_registry() lists every stub defined with LOOM_DEFINE_KERNEL (core/dispatch.h),
  // so a kernel added to core/kernels.h with only a CPU implementation fails here.
  const std::vector<KernelListing>& kernels = kernel_registry();
  REQUIRE(kernels.size() >= 35);  // core/kernels.h's 34 + sgd_update_kernel, at least
  auto missing_on_cuda = [&] {
    std::string missing;
    for (const KernelListing& k : kernels) {
      if (k.has(DeviceType::CPU) && !k.has(DeviceType::CUDA)) missing += std::string(missing.empty() ? "" : ", ") + k.name;
    }
    return missing;
  };
  bool saw_sgd = false;
  for (const KernelListing& k : kernels) saw_sgd = saw_sgd || std::string(k.name) == "sgd_update_kernel";
  CHECK(saw_sgd);
  const std::string missing = missing_on_cuda();
  INFO("kernels with a CPU but no CUDA implementation: ", missing);
  CHECK(missing.empty());
  // The scan does see a missing kernel: take one CUDA slot away for a moment.
  const auto dropout_cuda = dropout_kernel.table[static_cast<int>(DeviceType::CUDA)];
  dropout_kernel.set(DeviceType::CUDA, nullptr);
  CHECK(missing_on_cuda() == "dropout_kernel");
  dropout_kernel.set(DeviceType::CUDA, dropout_cuda);
  CHECK(optim::sgd_update_kernel.has(DeviceType::CUDA));
}

TEST_CASE("every kernel of the CUDA backend is registered (the static library is linked whole)" *
          doctest::skip(!cuda::is_compiled())) {
  auto registered = [](const auto& stub) { return stub.table[static_cast<int>(DeviceType::CUDA)] != nullptr; };
  CHECK(registered(unary_kernel));
  CHECK(registered(binary_kernel));
  CHECK(registered(pow_scalar_kernel));
  CHECK(registered(clamp_kernel));
  CHECK(registered(where_kernel));
  CHECK(registered(threshold_backward_kernel));
  CHECK(registered(fill_kernel));
  CHECK(registered(copy_kernel));
  CHECK(registered(uniform_kernel));
  CHECK(registered(normal_kernel));
  CHECK(registered(randint_kernel));
  CHECK(registered(reduce_kernel));
  CHECK(registered(max_min_dim_kernel));
  CHECK(registered(mm_kernel));
  CHECK(registered(bmm_kernel));
  CHECK(registered(conv2d_forward_kernel));
  CHECK(registered(conv2d_backward_kernel));
  CHECK(get_allocator(DeviceType::CUDA) == &cuda::caching_allocator());
}

// ---- with a GPU ----------------------------------------------------------------------------

TEST_SUITE("cuda (needs a GPU)") {

TEST_CASE("a device that does not exist is named in the error" * doctest::skip(!kGpu)) {
  Device missing(DeviceType::CUDA, cuda::device_count());
  bool threw = false;
  try {
    (void)empty({2}, TensorOptions().device(missing));
  } catch (const loom::Error& e) {
    threw = true;
    CHECK(contains(e.what(), "does not exist"));
  }
  CHECK(threw);
}

TEST_CASE("host <-> device round trips keep every dtype, layout and conversion" * doctest::skip(!kGpu)) {
  Tensor x = random_cpu({37, 53}, kFloat64, -100, 100, 1);
  for (DType dtype : {kFloat32, kFloat64, kInt64, kInt32, kUInt8, kBool, kFloat16, kBFloat16}) {
    INFO("dtype ", dtype);
    Tensor host = to_device(x, kCpu, dtype);                 // CPU conversion is the reference
    Tensor device = to_device(host, kCuda0);                 // H2D, same dtype
    check_close(to_device(device, kCpu), host, 0.0);         // D2H, same dtype: exact
    check_close(to_device(x, kCuda0, dtype), host, 0.0);     // H2D with conversion on the device
    check_close(to_device(to_device(x, kCuda0), kCpu, dtype), host, 0.0);  // D2H with conversion
  }
  // Strided source and destination on both sides.
  Tensor t = x.transpose(0, 1);
  check_close(to_device(t, kCuda0), t, 0.0);
  Tensor device_t = to_device(x, kCuda0).transpose(0, 1);
  Tensor host_dst = empty({53, 37}, kFloat64).transpose(0, 1);  // non-contiguous [37, 53]
  copy_into(host_dst, device_t.transpose(0, 1));
  check_close(host_dst, x, 0.0);
  // non_blocking: valid after the stream is synchronised.
  Tensor back = empty({37, 53}, kFloat64);
  copy_into(back, to_device(x, kCuda0), /*non_blocking=*/true);
  cuda::current_stream(0).synchronize();
  check_close(back, x, 0.0);
}


TEST_CASE("the caching allocator reuses blocks: no cudaMalloc and no growth over 1000 cycles" * doctest::skip(!kGpu)) {
  cuda::synchronize(0);
  empty_cache(DeviceType::CUDA);
  const AllocatorStats before = memory_stats(kCuda0);
  auto cycle = [] {
    Tensor a = gpu_empty({1000}, kFloat32);         // small pool
    Tensor b = gpu_empty({3, 1 << 20}, kFloat32);   // large pool, 12 MiB
    Tensor c = gpu_empty({1 << 20}, kFloat32);      // large pool, 4 MiB (a 20 MiB segment)
    fill_kernel(kCuda0)(a, 1.0);
  };
  cycle();
  const AllocatorStats warm = memory_stats(kCuda0);
  CHECK(warm.system_allocations > before.system_allocations);
  for (int i = 0; i < 1000; ++i) cycle();
  const AllocatorStats after = memory_stats(kCuda0);
  CHECK(after.system_allocations == warm.system_allocations);
  CHECK(after.reserved_bytes == warm.reserved_bytes);
  CHECK(after.allocated_bytes == before.allocated_bytes);
  CHECK(after.peak_allocated_bytes >= 16 * (1 << 20));
  // Freed blocks of a segment merge back, so empty_cache returns everything cached.
  empty_cache(DeviceType::CUDA);
  CHECK(memory_stats(kCuda0).reserved_bytes <= before.reserved_bytes);
}

TEST_CASE("an impossible allocation is a loom::Error naming the sizes" * doctest::skip(!kGpu)) {
  bool threw = false;
  try {
    (void)gpu_empty({int64_t{1} << 48}, kFloat32);  // 1 PiB
  } catch (const loom::Error& e) {
    threw = true;
    INFO(e.what());
    CHECK(contains(e.what(), "CUDA out of memory"));
    CHECK(contains(e.what(), "Tried to allocate "));
  }
  CHECK(threw);
  Tensor fine = gpu_empty({16}, kFloat32);  // the allocator still works afterwards
  fill_kernel(kCuda0)(fine, 2.0);
  CHECK(host_values(fine)[15] == 2.0);
}

TEST_CASE("a budget on cuda:0: just under it succeeds, past it the cache is freed, retried, then OutOfMemoryError" *
          doctest::skip(!kGpu)) {
  empty_cache(DeviceType::CUDA);
  const AllocatorStats start = memory_stats(kCuda0);
  const int64_t mib = 1 << 20;
  // Segments of large requests round to 2 MiB: a 40 MiB tensor reserves exactly 40 MiB.
  set_device_memory_limit(start.reserved_bytes + 40 * mib, kCuda0);
  {
    Tensor fits = gpu_empty({10 * mib}, kFloat32);
    CHECK(memory_reserved(kCuda0) == start.reserved_bytes + 40 * mib);
    std::string report;
    try {
      (void)gpu_empty({mib}, kFloat32);
    } catch (const OutOfMemoryError& e) {
      report = e.what();
    }
    INFO(report);
    CHECK(contains(report, "CUDA out of memory. Tried to allocate 4.00 MiB. Device cuda:0 has a total capacity of "));
    CHECK(contains(report, " allowed (set_per_process_memory_fraction / set_device_memory_limit); "));
    CHECK(memory_stats(kCuda0).num_ooms == start.num_ooms + 1);
    CHECK(memory_stats(kCuda0).num_alloc_retries == start.num_alloc_retries + 1);
  }
  // The freed 40 MiB are cached: a request served from the cache needs no new reservation.
  CHECK(gpu_empty({10 * mib}, kFloat32).numel() == 10 * mib);
  CHECK(memory_stats(kCuda0).num_ooms == start.num_ooms + 1);
  set_device_memory_limit(kNoMemoryLimit, kCuda0);
  CHECK(device_memory_capacity(kCuda0) > 0);
  CHECK(device_memory_free(kCuda0) <= device_memory_capacity(kCuda0));
}

TEST_CASE("events order work across streams" * doctest::skip(!kGpu)) {
  const int64_t n = 1 << 24;
  Tensor x = gpu_empty({n}, kFloat32);  // allocated on the default stream, used on the side stream
  cuda::Stream side = cuda::stream_from_pool(0);
  CHECK(side != cuda::default_stream(0));
  cuda::record_stream(x, side);
  // x's block may have been used by earlier work on the default stream: the side
  // stream starts after that work (the allocator only orders reuse on one stream).
  cuda::Event allocated;
  allocated.record(cuda::default_stream(0));
  allocated.wait(side);
  cuda::Event start(/*enable_timing=*/true), done(/*enable_timing=*/true);
  {
    cuda::StreamGuard guard(side);
    CHECK(cuda::current_stream(0) == side);
    start.record();
    fill_kernel(kCuda0)(x, 7.0);
    done.record();
  }
  CHECK(cuda::current_stream(0) == cuda::default_stream(0));
  done.wait(cuda::current_stream(0));  // the default stream's reads come after the fill
  Tensor sum = gpu_empty({1}, kFloat32);
  reduce_kernel(kCuda0)(ReduceOp::Sum, x, {0}, sum);
  CHECK(host_values(sum)[0] == doctest::Approx(7.0 * n).epsilon(1e-6));
  done.synchronize();
  CHECK(done.query());
  CHECK(start.elapsed_time(done) >= 0.0f);
}

TEST_CASE("copies between two GPUs" * doctest::skip(!kGpu)) {
  if (cuda::device_count() < 2) {
    MESSAGE("skipped: needs two GPUs, found ", cuda::device_count());
    return;
  }
  Tensor x = random_cpu({300, 200}, kFloat32, -1, 1, 30);
  Tensor on0 = to_device(x, kCuda0);
  Tensor on1 = to_device(on0, Device("cuda:1"));                  // contiguous peer copy
  check_close(on1, x, 0.0);
  Tensor strided = to_device(on0.transpose(0, 1), Device("cuda:1"), kFloat64);  // packed + converted
  check_close(strided, x.transpose(0, 1), 0.0);
}

}  // TEST_SUITE
