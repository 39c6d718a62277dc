// loomrun --numa-binding exclusive: each worker on this node gets its own, disjoint set
// of the CPUs loomrun may run on, as torchrun's `--numa-binding exclusive` gives each
// worker its own cores (there, near its GPU; here, on a CPU-only node, simply in order).
//
//   auto sets = exclusive_cpu_sets(allowed_cpus(), /*workers=*/2);   // {{0}, {1}} on 2 CPUs
//   // in worker i's child, before exec: bind_to(sets[i]);
//
// Note [Why bind DDP workers to cores]
// On a node whose cores all train, each rank's communicator thread wakes while every
// core already runs a training thread, and the scheduler may put it on the core of
// *another* rank's training thread. That rank then falls behind, and since DDP's ranks
// wait for each other at the end of every backward, the whole job runs at its pace.
// Bound, a rank's communicator delays only its own training thread, the same amount on
// every rank, and no core idles while its rank waits. On this project's 2-core machine
// (ResNet18, 2 ranks x 1 thread) binding took DDP from 0.91 to 0.96 of two independent
// processes, which themselves did not change (docs/benchmarks.md). Off by default, as in
// torchrun: binding is wrong when other jobs share the node's cores.
#pragma once

#include <string>
#include <vector>

namespace loom::launcher {

// The CPUs this process may run on (sched_getaffinity), ascending.
std::vector<int> allowed_cpus();

// Splits `cpus` into `workers` contiguous, disjoint sets whose sizes differ by at most
// one (the first ones get the smaller share). Throws loom::Error naming both counts
// when there are fewer CPUs than workers.
std::vector<std::vector<int>> exclusive_cpu_sets(const std::vector<int>& cpus, int workers);

// "0-3,8": the set as /proc/<pid>/status and taskset write it.
std::string cpu_list_string(const std::vector<int>& cpus);

}  // namespace loom::launcher
