// run_on_device_threads: n tasks at once, task 0 on the calling thread and task i on a
// worker thread that lives as long as the process. DataParallel runs its replicas this
// way, and the pipeline its stages.
//
//   run_on_device_threads(3, [&](size_t i) { outputs[i] = replicas[i](inputs[i]); });
//
// Note [Device threads persist]
// PyTorch starts a thread per replica at every DataParallel forward; on GPUs that costs
// nothing that matters. On CPU devices a new thread starts cold: every thread-local cache
// (OpenMP's thread team, oneDNN's) is built and faulted in again; that doubled
// DataParallel's ResNet18 step (888 ms instead of 497, measured when each thread also
// kept its own oneDNN scratchpad, now the caching allocator's: Note [oneDNN scratchpad]).
// So the workers live as long as the process, parked on a condition variable between
// calls. One call runs at a time (a second caller waits for the first); a task must not
// call run_on_device_threads itself.
//
// Note [What a device thread inherits]
// Grad mode and autocast are thread-local (Note [Autocast state is per thread]), so a
// replica or stage on another thread would otherwise run with grad on and autocast off
// whatever its caller chose, and its OpenMP team would be the default size, all cores
// for each of n threads. CallerState::capture() takes the caller's state on its own
// thread; a DeviceScope on each device thread puts it in place (plus the device's GPU as
// current), and restores the thread's own state when it ends, which matters for task 0:
// it runs on the caller's thread.
#pragma once

#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"

namespace loom::parallel {

// The caller's grad mode, autocast state and OpenMP threads, to be shared by `sharing`
// device threads (each gets max(1, threads / sharing)).
struct CallerState {
  bool grad_enabled = true;
  bool autocast_cpu = false, autocast_cuda = false;
  DType autocast_cpu_dtype = kBFloat16, autocast_cuda_dtype = kFloat16;
  int threads_each = 1;
  static CallerState capture(size_t sharing);
};

// On a device thread, for its lifetime: the caller's state, and `device` current when it
// is a GPU. See Note [What a device thread inherits].
class DeviceScope {
 public:
  DeviceScope(const CallerState& state, Device device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  struct Guards;
  bool previous_grad_;
  int previous_threads_;
  std::unique_ptr<Guards> guards_;
};

// Runs task(0) here and task(i), 0 < i < n, on worker thread i - 1, concurrently;
// returns when all have returned. Tasks must not throw (catch and hand errors back).
void run_on_device_threads(size_t n, const std::function<void(size_t)>& task);

// The errors tasks handed back, one slot per task: the first one that is set, rethrown
// as a loom::Error "<describe(i)>: <its message>". Nothing if none is set.
void rethrow_first_error(const std::vector<std::exception_ptr>& errors,
                         const std::function<std::string(size_t)>& describe);

}  // namespace loom::parallel
