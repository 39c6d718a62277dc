// The CUDA backend's public API in a build without it (-Dcuda=disabled, or no toolkit
// found under -Dcuda=auto), as torch.cuda in a CPU-only PyTorch: is_available() is
// false, device_count() is 0, and everything else throws a loom::Error saying how to
// get CUDA. Code above core/ and the tests therefore compile and link the same way in
// every build. Nothing here touches CUDA.
#include <string>

#include "core/allocator.h"
#include "core/error.h"
#include "cuda/caching_allocator.h"
#include "cuda/backends.h"
#include "cuda/device.h"
#include "cuda/host_allocator.h"
#include "cuda/random.h"

namespace loom::cuda {
namespace {

constexpr const char* kHowToGetCuda =
    "this loom was built without CUDA. Rebuild with `meson setup build -Dcuda=enabled` on a machine with the "
    "CUDA toolkit (nvcc, cuBLAS, cuDNN 9; see README.md), or run on the CPU (--device cpu)";

[[noreturn]] void not_compiled(const char* what) { LOOM_FAIL(what, ": ", kHowToGetCuda); }

// Installed as the CUDA allocator so that creating a tensor on cuda:N says why it fails.
class NoCudaAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes, Device device) override {
    not_compiled(::loom::detail::str("cannot allocate ", nbytes, " bytes on ", device).c_str());
  }
  void deallocate(void*, size_t, Device) override {}
  AllocatorStats stats(Device) const override { not_compiled("CUDA memory stats"); }
  void reset_peak_stats(Device) override { not_compiled("CUDA memory stats"); }
  void empty_cache() override {}
};

Allocator& no_cuda_allocator() {
  static auto* allocator = new NoCudaAllocator();
  return *allocator;
}

[[maybe_unused]] const bool g_installed = [] {
  set_allocator(DeviceType::CUDA, &no_cuda_allocator());
  return true;
}();

}  // namespace

bool is_compiled() { return false; }
int device_count() { return 0; }
bool is_available() { return false; }
std::string unavailable_reason() { return kHowToGetCuda; }
void check_device(Device device) { not_compiled(::loom::detail::str("no CUDA device is available for ", device).c_str()); }
int current_device() { not_compiled("cuda::current_device"); }
void set_device(int) { not_compiled("cuda::set_device"); }
int multiprocessor_count(int) { not_compiled("cuda::multiprocessor_count"); }

DeviceGuard::DeviceGuard(int) { not_compiled("cuda::DeviceGuard"); }
DeviceGuard::~DeviceGuard() = default;
void Stream::synchronize() const { not_compiled("cuda::Stream::synchronize"); }
bool Stream::query() const { not_compiled("cuda::Stream::query"); }
Stream current_stream(int) { not_compiled("cuda::current_stream"); }
Stream default_stream(int) { not_compiled("cuda::default_stream"); }
Stream stream_from_pool(int) { not_compiled("cuda::stream_from_pool"); }
StreamGuard::StreamGuard(Stream stream) : device_guard_(stream.device), previous_stream_(nullptr), device_(stream.device) {}
StreamGuard::~StreamGuard() = default;

Event::~Event() = default;
Event::Event(Event&& other) noexcept : device_(other.device_), enable_timing_(other.enable_timing_) {}
Event& Event::operator=(Event&& other) noexcept {
  device_ = other.device_;
  enable_timing_ = other.enable_timing_;
  return *this;
}
void Event::record(Stream) { not_compiled("cuda::Event::record"); }
void Event::record() { not_compiled("cuda::Event::record"); }
void Event::wait(Stream) const { not_compiled("cuda::Event::wait"); }
void Event::synchronize() const { not_compiled("cuda::Event::synchronize"); }
bool Event::query() const { not_compiled("cuda::Event::query"); }
float Event::elapsed_time(const Event&) const { not_compiled("cuda::Event::elapsed_time"); }
void synchronize(int) { not_compiled("cuda::synchronize"); }

Allocator& caching_allocator() { return no_cuda_allocator(); }
void record_stream(const Tensor&, Stream) { not_compiled("cuda::record_stream"); }
Allocator& pinned_host_allocator() { not_compiled("pinned host memory"); }
bool is_pinned(const void*) { return false; }
void record_pinned_use(const void*, Stream) {}
Tensor copy_to_device_async(const Tensor&, Device) { not_compiled("cuda::copy_to_device_async"); }

void set_allow_tf32(bool) {}
bool allow_tf32() { return false; }
void set_cudnn_allow_tf32(bool) {}
bool cudnn_allow_tf32() { return true; }

uint64_t device_random_bits_on_host(uint64_t, uint64_t) { not_compiled("cuda::device_random_bits_on_host"); }
double device_random_uniform_on_host(uint64_t, uint64_t) { not_compiled("cuda::device_random_uniform_on_host"); }

}  // namespace loom::cuda
