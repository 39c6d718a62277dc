// model_state_bytes: how much memory a model's training state holds in this process —
// its parameters, their gradients and the optimizer's state — the quantity ZeRO and FSDP
// shard (docs/sharding.md). Activations and workspace are not in it; the allocator's
// peak (memory_stats) is the figure that includes them.
//
//   int64_t bytes = nn::model_state_bytes(*model, optimizer);   // after optimizer.step()
//
// Note [Counting storages, not tensors]
// What occupies memory is storages. Views share one (DDP's gradient_as_bucket_view leaves
// every .grad() a view into a bucket; FSDP's parameters are views into a flat buffer), so
// each storage is counted once, at its full size, however many tensors look into it and
// whether or not they cover all of it. A parameter whose storage has been released (FSDP
// frees a unit's gathered parameters to an empty storage) counts 0. The optimizer reports
// the state tensors it holds in this process (Optimizer::state_tensors), so a ZeRO rank
// counts only its partition's.
#pragma once

#include <cstdint>

#include "nn/module.h"              // defines: Module
#include "nn/optim/optimizer.h"     // defines: Optimizer

namespace loom::nn {

// Bytes of the distinct storages behind module.parameters(), their .grad()s and
// optimizer.state_tensors(). See Note [Counting storages, not tensors].
int64_t model_state_bytes(const Module& module, const optim::Optimizer& optimizer);
// The same without an optimizer: parameters and gradients.
int64_t model_state_bytes(const Module& module);

}  // namespace loom::nn
