// Where training runs: --device cpu | cpu:N | cuda | cuda:N, checked up front, and the
// copy of each batch to it.
//
//   const Device device = training_device("cuda");   // a loom::Error saying why, if no GPU
//   Tensor images = to_training_device(batch.data, device);
//
// On a GPU, a step must not wait for the host more than once: batches cross from
// pinned memory without blocking (cuda::copy_to_device_async, as PyTorch's
// DataLoader(pin_memory=True) + .to(device, non_blocking=True)), and the step's loss
// and accuracy are read back together, once (read_loss_and_correct).
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "core/tensor.h"

namespace loom::training {

// The device named by --device, after checking it can be used: for cuda / cuda:N that
// this loom has the CUDA backend and that the GPU exists, else a loom::Error naming the
// reason (cuda::unavailable_reason()) and the alternative (--device cpu). "cuda" without
// an index means cuda:`default_index` -- under --mode ddp the trainer passes LOCAL_RANK,
// so each process takes its own GPU, as torch.device("cuda", local_rank) in a torchrun
// script. Nothing is allocated on the device.
Device training_device(const std::string& flag, int default_index = 0);

// --device-memory-limit SIZE ("1.5GiB", "512MiB"; "" for none): the budget of Note [Device
// memory budget] (core/memory.h) on `first` and the devices after it, `count` in all, as
// torch.cuda.set_per_process_memory_fraction on each GPU a process uses; CUDA devices past
// the last visible GPU are skipped. Each process caps its own devices, so under loomrun it is
// a budget per rank. On the CPU, train on cpu:1 to keep the dataset and the loader's batches
// (on cpu, host memory) out of the budget, as a GPU's budget excludes host memory.
void apply_device_memory_limit(const std::string& flag, Device first, int64_t count);

// --memory-format auto | contiguous | channels_last: the layout images enter the model
// in (Note [Channels-last activations], core/memory_format.h). auto is channels_last for
// --amp bf16 on the CPU, where oneDNN's bfloat16 convolutions compute in NHWC and NCHW
// activations would be reordered around every one (as PyTorch users write
// model(images.contiguous(memory_format=torch.channels_last))), and for float32 on CPUs
// without AVX-512, where loom's Winograd and oneDNN's AVX2 kernels take NHWC as it is
// (Note [Channels-last on AVX2], core/cpu/activation_layout.h); contiguous otherwise:
// float32 convolutions on AVX-512 compute in a blocked layout either way, and on CUDA
// loom's kernels take NCHW.
MemoryFormat input_memory_format(const std::string& flag, const std::string& amp, Device device);

// `batch` (CPU) on `device`, in `format`: a non-blocking copy through pinned memory for
// CUDA, a plain .to(device) otherwise.
Tensor to_training_device(const Tensor& batch, Device device, MemoryFormat format = MemoryFormat::Contiguous);

// The loss (a 0-dim tensor) and the number of rows whose argmax equals the label,
// computed on the logits' device and read back to the host in one copy.
std::pair<float, int64_t> read_loss_and_correct(const Tensor& loss, const Tensor& logits, const Tensor& labels);

}  // namespace loom::training
