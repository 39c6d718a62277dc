// agree_on_kernel_choices: every rank computes with rank 0's kernel algorithms.
//
//   loom::backends::cpu::set_benchmark(true);
//   ... one training step on every rank ...
//   loom::distributed::agree_on_kernel_choices(*process_group);   // DDP does this itself
//
// With loom::backends::cpu::benchmark on, each rank times the candidate algorithms of a
// new shape on its own (Note [Kernel autotuning], core/cpu/kernel_benchmark.h), and two
// ranks' timings can disagree, so that replicas would round differently. This hands
// every rank rank 0's whole table: one small broadcast of its length and one of its
// text, paid once (DistributedDataParallel calls it at its second training forward,
// when every rank has met every shape of a step). Choices of shapes rank 0 has not met
// stay each rank's own. Replicas whose weights DDP keeps equal stay equal either way
// (they apply the same averaged gradient); agreement makes their forward passes equal too.
#pragma once

#include "parallel/comm/communicator.h"  // defines: distributed::Communicator

namespace loom::distributed {

// Collective: every rank of `group` calls it at the same point.
void agree_on_kernel_choices(Communicator& group);

}  // namespace loom::distributed
