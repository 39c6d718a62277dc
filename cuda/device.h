// CUDA devices, streams and events: what torch.cuda offers for them, under loom::cuda.
//
//   if (loom::cuda::is_available()) {
//     loom::cuda::DeviceGuard guard(1);              // kernels below run on cuda:1
//     loom::cuda::Stream side = loom::cuda::stream_from_pool(1);
//     loom::cuda::Event ready;
//     ready.record(loom::cuda::current_stream(1));   // work so far on cuda:1 ...
//     ready.wait(side);                              // ... happens before work on `side`
//   }
//
// This is a public header: it includes no CUDA header (streams and events are the
// runtime's opaque pointers, declared here), so code above core/ and the tests can use
// it in every build. A -Dcuda=disabled build links cuda/disabled.cpp instead, where
// is_available() is false and everything else explains how to get CUDA.
//
// Note [Streams in loom]
// Every CUDA kernel and copy loom issues for device d runs on current_stream(d). By
// default that is one non-blocking stream per device, created on first use and never
// destroyed: non-blocking, so that loom's work never serialises with the legacy NULL
// stream another library may use. A thread may select another stream for a scope with
// StreamGuard (thread-local, as torch.cuda.stream(...)); the caller then owns ordering
// between streams, with Events. A tensor's memory is tied to the stream that allocated
// it; see Note [Allocator streams] in cuda/caching_allocator.h.
#pragma once

#include <string>

#include "core/device.h"  // defines: loom::Device

struct CUstream_st;  // the runtime's cudaStream_t is CUstream_st*
struct CUevent_st;   // cudaEvent_t is CUevent_st*

namespace loom::cuda {

constexpr int kMaxDevices = 64;

// False in a build without the CUDA backend (-Dcuda=disabled or no toolkit found).
bool is_compiled();
// The number of visible GPUs (CUDA_VISIBLE_DEVICES applies, through the runtime).
// Any failure to ask -- no driver, no device, a driver older than the runtime -- counts
// as zero GPUs. Asked once, on first call, then cached.
int device_count();
bool is_available();
// Why device_count() is 0, in words ("" when a GPU is available).
std::string unavailable_reason();
// Throws a loom::Error that says what is wrong and what to do unless `device` is a
// CUDA device that exists. Called before any CUDA memory is handed out.
void check_device(Device device);

int current_device();
void set_device(int index);
// Streaming multiprocessors of a device (cached): kernels size their grids with it.
int multiprocessor_count(int index);

// Makes `index` the current device for the scope and restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;  // -1: nothing to restore
};

// A stream of one device: a value type, like torch.cuda.Stream; loom owns the handle.
struct Stream {
  CUstream_st* handle = nullptr;
  int device = 0;

  void synchronize() const;  // blocks the host until all work queued so far is done
  bool query() const;        // true when all work queued so far is done
  bool operator==(const Stream&) const = default;
};

// The stream loom's work for `device` goes to on this thread (-1: the current device).
Stream current_stream(int device = -1);
// loom's per-device stream, used when no StreamGuard is active.
Stream default_stream(int device = -1);
// One of a few extra streams per device, handed out round-robin (for overlapping
// communication or copies with compute; as torch.cuda.Stream() without the leak).
Stream stream_from_pool(int device = -1);

// Makes `stream` the current stream of its device on this thread, and its device the
// current device, for the scope; restores both.
class StreamGuard {
 public:
  explicit StreamGuard(Stream stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  DeviceGuard device_guard_;  // first: it validates the device before the others use it
  CUstream_st* previous_stream_;
  int device_;
};

// A marker in a stream's work, as torch.cuda.Event. Created lazily, on the device of the
// stream it is first recorded on.
class Event {
 public:
  explicit Event(bool enable_timing = false) : enable_timing_(enable_timing) {}
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record(Stream stream);
  void record();                   // on the current stream of the current device
  void wait(Stream stream) const;  // `stream`'s later work waits for this event; no-op if never recorded
  void synchronize() const;        // blocks the host until the event has happened
  bool query() const;              // true when it has happened (or was never recorded)
  // Milliseconds from this event to `end`; both recorded with enable_timing = true.
  float elapsed_time(const Event& end) const;
  bool recorded() const { return handle_ != nullptr; }

 private:
  CUevent_st* handle_ = nullptr;
  int device_ = -1;
  bool enable_timing_;
};

// Waits for all work on `device` (-1: the current device), on every stream.
void synchronize(int device = -1);

}  // namespace loom::cuda
