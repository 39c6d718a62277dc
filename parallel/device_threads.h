// run_on_device_threads: n tasks at once, task 0 on the calling thread and task i on a
// worker thread that lives as long as the process. DataParallel runs its replicas this
// way, and the pipeline its stages.
//
//   run_on_device_threads(3, [&](size_t i) { outputs[i] = replicas[i](inputs[i]); });
//
// Note [Device threads persist]
// PyTorch starts a thread per replica at every DataParallel forward; on GPUs that costs
// nothing that matters. On CPU devices a new thread starts cold: oneDNN's per-thread
// scratchpad (core/cpu/conv2d.cpp) is allocated and faulted in again, and so is every
// thread-local cache; that doubled DataParallel's ResNet18 step (888 ms instead of 497).
// So the workers live as long as the process, parked on a condition variable between
// calls. One call runs at a time (a second caller waits for the first); a task must not
// call run_on_device_threads itself.
#pragma once

#include <cstddef>
#include <functional>

namespace loom::parallel {

// Runs task(0) here and task(i), 0 < i < n, on worker thread i - 1, concurrently;
// returns when all have returned. Tasks must not throw (catch and hand errors back).
void run_on_device_threads(size_t n, const std::function<void(size_t)>& task);

}  // namespace loom::parallel
