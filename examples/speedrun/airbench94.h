// The airbench94 recipe: CIFAR-10 to 94% test accuracy in under ten epochs (Keller Jordan's
// airbench94, which reaches it in 3.83 s on an A100), built from loom's reusable pieces:
//
//   piece                                   where
//   the network, dirac_ init, frozen-gain BN nn/airbench.h, nn::init::dirac_
//   whitening first layer (LAPACK eigh)      nn/whitening.h, core/eigh.h
//   SGD + Nesterov with two param groups     nn/optim/sgd.h
//   triangular lr per step                   optim::LambdaLR + optim::interp
//   Lookahead over weights and BN buffers    nn/optim/lookahead.h
//   summed, label-smoothed cross-entropy     loom::cross_entropy(..., Reduction::Sum, ..., 0.2)
//   alternating flip + reflect translate     data/in_memory_loader.h
//   6-view test-time augmentation            nn/test_time_augmentation.h
//
// run_airbench94 is the whole timed run: whitening, training and the final TTA evaluation.
// examples/airbench.cpp is its command line; tests/test_airbench.cpp runs a short prefix.
//
// Note [airbench94's hyperparameters]
// lr 11.5 and weight decay 0.0153 are per 1024 examples and *decoupled* from the momentum:
// with momentum m, steps grow by (1 + 1/(1 - m)) over the gradient, so the lr PyTorch's
// SGD sees is 11.5 / (1024 (1 + 1/(1 - m))) = 1.465e-3 (m = 0.85), and the per-step decay
// lr * weight_decay is 0.0153 * batch / (1024 (1 + 1/(1 - m))) = 2.0e-3, i.e. weight_decay =
// 1.3626 in PyTorch's convention. BatchNorm biases take lr x 64 and weight_decay / 64 (the
// same decay per step). The loss is summed over the batch, not averaged: the lr above is
// per example. The schedule rises linearly from 0.2 to 1 over the first 23% of the steps
// and falls to 0.07 at the end; Lookahead every 5 steps with decay 0.95^5 (t / T)^3 (near 0
// early: the average follows the weights; 0.77 at the end: it smooths the last steps).
//
// Note [Where the speedrun's memory goes]
// The run's peak RSS is everything the process holds at its highest: the data set's tensors,
// the caching allocator's blocks (in use, and cached for reuse; the kernels' workspaces,
// oneDNN's scratchpads and reorders, are its tensors too), and libraries' code and
// buffers. run_airbench94 records each at the end of every phase (Airbench94Result::memory;
// airbench --metrics-json writes them), so a peak can be traced to its phase and its part;
// bench/speedrun_memory.py compares them with PyTorch's peak on the same run.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/memory_format.h"
#include "core/tensor.h"
#include "data/in_memory_loader.h"  // defines: Flip
#include "nn/airbench.h"            // defines: AirbenchNet
#include "nn/test_time_augmentation.h"  // defines: TTA

namespace loom::distributed {
class Communicator;
}

namespace loom::examples {

struct Airbench94Config {
  // See Note [airbench94's hyperparameters].
  int64_t batch_size = 1024;
  double epochs = 9.9;
  double lr = 11.5, momentum = 0.85, weight_decay = 0.0153, bias_scaler = 64, label_smoothing = 0.2;
  double lr_start = 0.2, lr_peak_at = 0.23, lr_end = 0.07;
  int64_t whiten_bias_epochs = 3, whiten_images = 5000;
  double whiten_eps = 5e-4;
  int64_t lookahead_every = 5;
  double lookahead_decay = 0.95;
  data::Flip flip = data::Flip::alternating;
  int64_t translate = 2;
  nn::TTA tta = nn::TTA::mirror_translate;
  int64_t eval_batch_size = 2000;

  uint64_t seed = 0;
  int64_t max_steps = -1;          // stop after this many steps (the schedules keep the full run's shape)
  bool eval_every_epoch = false;   // untimed plain test accuracy after each epoch
  bool bf16 = false;               // CPU autocast to bfloat16 for the forward
  MemoryFormat memory_format = MemoryFormat::Contiguous;  // of the batches
  std::shared_ptr<distributed::Communicator> process_group;  // DDP when set (world size > 1)
  std::function<void(const std::string&)> log;               // progress lines (rank 0); null: silent
};

struct Airbench94Epoch {
  int64_t epoch = 0, steps = 0;
  double train_loss = 0;   // mean per-example loss over the epoch's batches
  double accuracy = -1;    // plain test accuracy with eval_every_epoch, else -1
  double elapsed_s = 0;    // timed seconds since the start
};

// The process's memory at the end of one phase of the run (Note [Where the speedrun's memory
// goes], docs/speedrun.md): what the run measures to say where its peak RSS comes from.
struct Airbench94Memory {
  std::string phase;                  // data, whitening, first step, training, tta, accuracy
  int64_t resident = 0;               // the process's RSS now (bytes)
  int64_t peak_resident = 0;          // its highest so far (getrusage's ru_maxrss)
  int64_t allocated = 0, reserved = 0;            // the caching allocator's, now
  int64_t peak_allocated = 0, peak_reserved = 0;  // the caching allocator's highest within the phase
  int64_t system_allocations = 0;     // the caching allocator's misses so far (flat once it is steady)
};

struct Airbench94Result {
  double tta_accuracy = 0, accuracy = 0;  // fractions; accuracy (no TTA) is untimed
  double wall_time_s = 0;                 // whitening + training + TTA
  double whitening_s = 0, train_s = 0, data_s = 0, lookahead_s = 0, tta_s = 0;
  int64_t steps = 0;
  double train_loss_last = 0;             // the last step's loss per example
  std::vector<Airbench94Epoch> per_epoch;
  int64_t data_bytes = 0;                 // the training and test tensors the run holds
  std::vector<Airbench94Memory> memory;   // at the end of each phase, in order
};

// CIFAR-10 as normalised float32 images [N, 3, 32, 32] and int64 labels [N], read once
// (untimed). mean/std are airbench's: (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616).
// The images are laid out in `format`: the test images in the batches' layout are the ones
// run_airbench94 evaluates on as they are, where others would be copied into it.
struct CifarTensors {
  Tensor images, labels;
};
CifarTensors load_cifar10_tensors(const std::string& root, bool train,
                                  MemoryFormat format = MemoryFormat::Contiguous);

// Steps of the whole run: ceil(batches per epoch * epochs), batches dropping the last partial one.
int64_t airbench94_total_steps(const Airbench94Config& config, int64_t train_size);

// Builds the net (seeded with config.seed), trains it on `train` and evaluates it on `test`.
Airbench94Result run_airbench94(const Airbench94Config& config, const CifarTensors& train, const CifarTensors& test);

}  // namespace loom::examples
