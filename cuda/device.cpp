// Devices, streams and events; see cuda/device.h and Note [Streams in loom].
#include "cuda/device.h"

#include <cuda_runtime_api.h>  // defines: cudaGetDeviceCount, cudaStreamCreateWithFlags, cudaEvent*

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <utility>

#include "cuda/check.h"  // defines: LOOM_CUDA_CHECK

namespace loom::cuda {
namespace {

struct DeviceQuery {
  int count = 0;
  std::string reason;  // why count is 0
};

// Asked once: the answer cannot change within a process (CUDA_VISIBLE_DEVICES is read by
// the runtime at initialisation). Never throws: no GPU is a normal state, not an error.
const DeviceQuery& query_devices() {
  static const DeviceQuery query = [] {
    DeviceQuery q;
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    std::string visible_note =
        visible ? ::loom::detail::str(" (CUDA_VISIBLE_DEVICES=\"", visible, "\")") : std::string();
    int n = 0;
    cudaError_t error = cudaGetDeviceCount(&n);
    if (error != cudaSuccess) {
      (void)cudaGetLastError();
      q.reason = ::loom::detail::str("cudaGetDeviceCount failed: ", detail::cuda_error_string(error), visible_note);
    } else if (n == 0) {
      q.reason = "the CUDA runtime sees no device" + visible_note;
    } else {
      q.count = std::min(n, kMaxDevices);
    }
    return q;
  }();
  return query;
}

int resolve(int device) { return device < 0 ? current_device() : device; }

// Per device, created on first use and never destroyed: handles may be used by static
// objects' destructors and by other threads until the process exits.
struct DeviceStreams {
  std::once_flag created;
  cudaStream_t default_stream = nullptr;
  static constexpr int kPoolSize = 4;
  std::array<cudaStream_t, kPoolSize> pool{};
  std::atomic<unsigned> next_pooled{0};
};
std::array<DeviceStreams, kMaxDevices> g_streams;

DeviceStreams& streams_of(int device) {
  check_device(Device(DeviceType::CUDA, device));
  DeviceStreams& s = g_streams[static_cast<size_t>(device)];
  std::call_once(s.created, [&] {
    DeviceGuard guard(device);
    LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&s.default_stream, cudaStreamNonBlocking),
                    "creating the default stream of cuda:", device);
    for (auto& stream : s.pool)
      LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "creating pooled streams of cuda:", device);
  });
  return s;
}

// The stream a StreamGuard selected on this thread, per device; null: the default.
thread_local std::array<cudaStream_t, kMaxDevices> t_current_stream{};

}  // namespace

bool is_compiled() { return true; }
int device_count() { return query_devices().count; }
bool is_available() { return device_count() > 0; }
std::string unavailable_reason() { return query_devices().reason; }

void check_device(Device device) {
  LOOM_CHECK(device.is_cuda(), "expected a CUDA device, got ", device);
  const DeviceQuery& q = query_devices();
  LOOM_CHECK(q.count > 0, "no CUDA device is available for ", device, ": ", q.reason,
             ". Run on the CPU instead (--device cpu), or check that `nvidia-smi` lists a GPU.");
  LOOM_CHECK(device.index < q.count, device, " does not exist: ", q.count, " CUDA device", q.count == 1 ? " is" : "s are",
             " visible (cuda:0", q.count > 1 ? ::loom::detail::str("..cuda:", q.count - 1) : std::string(), ")");
}

int current_device() {
  if (!is_available()) check_device(Device(DeviceType::CUDA, 0));  // throws: says why there is no GPU
  int device = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&device), "asking for the current device");
  return device;
}

void set_device(int index) {
  check_device(Device(DeviceType::CUDA, index));
  LOOM_CUDA_CHECK(cudaSetDevice(index), "selecting cuda:", index);
}

int multiprocessor_count(int index) {
  check_device(Device(DeviceType::CUDA, index));
  static std::array<std::atomic<int>, kMaxDevices> cache{};
  int count = cache[static_cast<size_t>(index)].load(std::memory_order_relaxed);
  if (count == 0) {
    LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, index),
                    "asking cuda:", index, " for its multiprocessor count");
    cache[static_cast<size_t>(index)].store(count, std::memory_order_relaxed);
  }
  return count;
}

DeviceGuard::DeviceGuard(int index) {
  int current = current_device();
  if (current != index) {
    set_device(index);
    previous_ = current;
  }
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) (void)cudaSetDevice(previous_);  // a destructor must not throw
}

void Stream::synchronize() const {
  LOOM_CUDA_CHECK(cudaStreamSynchronize(handle), "waiting for a stream of cuda:", device);
}

bool Stream::query() const {
  cudaError_t status = cudaStreamQuery(handle);
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  LOOM_CUDA_CHECK(status, "querying a stream of cuda:", device);
  return true;
}

Stream current_stream(int device) {
  device = resolve(device);
  DeviceStreams& streams = streams_of(device);  // validates `device` first
  cudaStream_t selected = t_current_stream[static_cast<size_t>(device)];
  return Stream{selected ? selected : streams.default_stream, device};
}

Stream default_stream(int device) {
  device = resolve(device);
  return Stream{streams_of(device).default_stream, device};
}

Stream stream_from_pool(int device) {
  device = resolve(device);
  DeviceStreams& s = streams_of(device);
  unsigned i = s.next_pooled.fetch_add(1, std::memory_order_relaxed) % DeviceStreams::kPoolSize;
  return Stream{s.pool[i], device};
}

StreamGuard::StreamGuard(Stream stream)
    : device_guard_(stream.device),
      previous_stream_(t_current_stream[static_cast<size_t>(stream.device)]),
      device_(stream.device) {
  t_current_stream[static_cast<size_t>(device_)] = stream.handle;
}

StreamGuard::~StreamGuard() { t_current_stream[static_cast<size_t>(device_)] = previous_stream_; }

Event::~Event() {
  if (handle_) (void)cudaEventDestroy(handle_);
}

Event::Event(Event&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)), device_(other.device_), enable_timing_(other.enable_timing_) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (handle_) (void)cudaEventDestroy(handle_);
    handle_ = std::exchange(other.handle_, nullptr);
    device_ = other.device_;
    enable_timing_ = other.enable_timing_;
  }
  return *this;
}

void Event::record(Stream stream) {
  DeviceGuard guard(stream.device);
  if (!handle_) {
    unsigned flags = enable_timing_ ? cudaEventDefault : cudaEventDisableTiming;
    LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&handle_, flags), "creating an event on cuda:", stream.device);
    device_ = stream.device;
  }
  LOOM_CHECK(device_ == stream.device, "Event::record: this event belongs to cuda:", device_,
             " but the stream is on cuda:", stream.device, "; use one event per device");
  LOOM_CUDA_CHECK(cudaEventRecord(handle_, stream.handle), "recording an event on cuda:", stream.device);
}

void Event::record() { record(current_stream()); }

void Event::wait(Stream stream) const {
  if (!handle_) return;
  DeviceGuard guard(stream.device);
  LOOM_CUDA_CHECK(cudaStreamWaitEvent(stream.handle, handle_, 0), "making a stream of cuda:", stream.device,
                  " wait for an event of cuda:", device_);
}

void Event::synchronize() const {
  if (handle_) LOOM_CUDA_CHECK(cudaEventSynchronize(handle_), "waiting for an event of cuda:", device_);
}

bool Event::query() const {
  if (!handle_) return true;
  cudaError_t status = cudaEventQuery(handle_);
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  LOOM_CUDA_CHECK(status, "querying an event of cuda:", device_);
  return true;
}

float Event::elapsed_time(const Event& end) const {
  LOOM_CHECK(enable_timing_ && end.enable_timing_, "elapsed_time needs two events created with enable_timing = true");
  LOOM_CHECK(handle_ && end.handle_, "elapsed_time needs both events recorded first");
  float ms = 0;
  LOOM_CUDA_CHECK(cudaEventElapsedTime(&ms, handle_, end.handle_), "measuring the time between two events");
  return ms;
}

void synchronize(int device) {
  device = resolve(device);
  DeviceGuard guard(device);
  LOOM_CUDA_CHECK(cudaDeviceSynchronize(), "waiting for all work on cuda:", device);
}

}  // namespace loom::cuda
