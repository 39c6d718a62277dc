// Stage balance: where to cut a Sequential into the stages of a model-parallel run or a
// pipeline (torchgpipe's `balance`: a list of layer counts, one per stage).
//
//   auto layers = nn::resnet18(10)->sequential();             // 14 layers
//   Tensor sample = zeros({8, 3, 32, 32});                     // one micro-batch
//   auto b = parallel::balance_by_cost_model(*layers, sample, 4);   // e.g. {4, 3, 4, 3}
//   auto t = parallel::balance_by_time(*layers, sample, 4);         // measured: may differ
//
// Note [Stage balance]
// Each stage should take about the same time, since the slowest bounds a pipeline's
// throughput, and for layer-wise model parallelism about the same memory.
// balance_by_cost() cuts a list of per-layer costs into contiguous groups whose largest
// total is as small as possible; the two ways of getting those costs follow. Parameter
// counts alone would be the wrong cost for ResNet18: its last residual stage (layer4)
// holds 75% of the parameters but about a quarter of the work.
//
// Note [Balance by a cost model]
// The default (balance_by "cost"). Each layer's cost is counted, not timed
// (Note [Counted, not timed], core/flop_counter.h): its forward FLOPs, the bytes of the
// activations it writes (Note [Activation bytes by difference], balance.cpp), both for the
// whole micro-batch, and its parameter bytes, weighed into one number of forward FLOPs:
//     cost = flops + 20 · activation bytes + 200 · parameter bytes
// The weights were fitted to measured layer times (balance.cpp says where); backward's
// work is proportional to forward's and so needs no term of its own. The counts depend
// only on the shapes, so every rank of every run computes the same balance, whatever the
// load: replicas of a stage under pp × dp cut alike, and a run repeats bit for bit.
//
// balance_by_time() (balance_by "time", torchgpipe's balance_by_time) measures each layer's
// forward and backward instead. It sees what the cost model cannot (a slow kernel, a
// cache that a layer's weights overflow), but it changes with the machine's noise, so
// across processes it is measured once, on global rank 0, and broadcast to every rank
// (agree_on_balance, parallel/pipeline/pipeline_processes.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"    // defines: Tensor
#include "nn/container.h"   // defines: Sequential

namespace loom::parallel {

// Splits costs[0..n) into `stages` contiguous, non-empty groups whose largest sum is as
// small as possible (ties: earlier stages take fewer layers); returns each group's size.
// A loom::Error if there are fewer layers than stages.
std::vector<int64_t> balance_by_cost(const std::vector<double>& costs, int64_t stages);

// What one layer costs per micro-batch, counted (Note [Balance by a cost model]).
struct LayerCost {
  int64_t flops = 0;             // forward FLOPs of convolutions and matrix products
  int64_t activation_bytes = 0;  // bytes its forward allocates per example, times the batch
  int64_t parameter_bytes = 0;   // bytes of its parameters
  double cost() const;           // the formula of Note [Balance by a cost model]
};

// Each layer of `module` counted on `sample` (a micro-batch: only its shape and dtype
// matter; one and two examples of it are run, and the counts scaled to its batch). The module is
// left as it was (BatchNorm's running statistics, gradients).
std::vector<LayerCost> count_layer_costs(nn::Sequential& module, const Tensor& sample);

// balance_by_cost over count_layer_costs: the same on every rank and every run.
std::vector<int64_t> balance_by_cost_model(nn::Sequential& module, const Tensor& sample, int64_t stages);

// balance_by_cost over each layer's measured forward + backward time on `sample` (the
// fastest of `repeats` runs after one warm-up: on a shared machine noise only adds time),
// on the device where the module is. The module is left as it was.
std::vector<int64_t> balance_by_time(nn::Sequential& module, const Tensor& sample, int64_t stages, int repeats = 5);

// A loom::Error unless `balance` has `stages` positive entries adding up to `layers`,
// naming the Sequential's length (torchgpipe's balance).
void check_balance(const std::vector<int64_t>& balance, int64_t stages, int64_t layers);

// A loom::Error naming the choices unless `by` is "cost" or "time".
void check_balance_by(const std::string& by);

// The balance a run asks for, in one process: `given` (checked) if not empty, else
// `by` = "cost" (balance_by_cost_model) or "time" (balance_by_time).
std::vector<int64_t> choose_balance(nn::Sequential& module, const std::vector<int64_t>& given, const std::string& by,
                                    int64_t stages, const Tensor& sample);

// "4,3,4,3": a balance as logs print it and command lines take it.
std::string balance_str(const std::vector<int64_t>& balance);

}  // namespace loom::parallel
