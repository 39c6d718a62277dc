// Host staging: how the gloo backend moves CUDA tensors, as PyTorch's does.
//
//   HostStaged staged = stage_on_host(op);   // caller's thread: device -> host copies
//   run(staged.op);                          // communicator's thread: a host collective
//   copy_results_back(staged);               // same thread: host -> device, then done
//
// Note [CUDA tensors through gloo]
// Gloo moves host memory, yet PyTorch scripts run DDP on GPUs with backend="gloo" (to
// share one GPU between ranks, or where NCCL is missing), and PyTorch's gloo backend
// accepts CUDA tensors by copying them to the host and back. loom does the same:
//  - the copies to the host happen in launch(), on the caller's thread: a blocking copy
//    ordered after everything the caller queued on its current stream, so the collective
//    sees what the caller's kernels wrote, whichever stream wrote it;
//  - the host operation runs on the communicator's thread like any other;
//  - the results are copied back (blocking) on that thread before the Work completes,
//    so when wait() returns the caller's tensor holds them.
// Only the operation's outputs are copied back: the in-place tensor of all_reduce and
// broadcast, all_gather's list, reduce_scatter's output. Each costs two PCIe copies per
// byte that NCCL does not make: use nccl for speed, gloo for reach. Point-to-point CUDA
// tensors are refused with a clear error (PyTorch's gloo refuses them too).
#pragma once

#include <utility>
#include <vector>

#include "core/device.h"
#include "parallel/comm/op.h"

namespace loom::distributed {

struct HostStaged {
  Op op;  // the same operation, on host tensors
  std::vector<std::pair<Tensor, Tensor>> results;  // (the caller's tensor, its host stand-in)
};

// Whether `op` holds a tensor that is not in host memory (a CUDA tensor).
bool needs_host_staging(const Op& op);

// `op` with every tensor replaced by one on `host`: inputs copied there, outputs allocated
// there. `host` is cpu:0 in use; tests pass cpu:1 to exercise the bookkeeping on a CPU.
HostStaged stage_on_host(const Op& op, Device host = Device(DeviceType::CPU));

// Copies each output's host stand-in into the caller's tensor (blocking).
void copy_results_back(const HostStaged& staged);

}  // namespace loom::distributed
