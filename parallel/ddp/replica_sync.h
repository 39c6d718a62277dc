// Making every rank's replica of the model the same: the checks and broadcasts DDP runs
// at construction (parameters and buffers) and at each forward (buffers).
//
// Note [Check shapes before broadcasting]
// DDP starts by broadcasting rank 0's parameters. If a rank built a different model (a
// different width, a forgotten layer), that broadcast would move mismatched bytes, and
// every later bucket would be wrong; the communicator's own check would catch the
// broadcast, but only as "broadcast of float32 [11173962] vs [11172880]". So DDP first
// all-gathers a description of every rank's parameters (count, then each one's dtype and
// shape) and every rank reports the first parameter that differs, by name and index, with
// the ranks on each side: the same clean error on every rank, never a hang.
//
// Note [Coalesced broadcast]
// ResNet18 has 62 parameters and 60 buffers; one broadcast each would be 122 collectives
// (each with its fingerprint round trip) per call, and DDP broadcasts the buffers before
// every forward. Instead the tensors of each dtype are packed into one flat tensor,
// broadcast once, and unpacked on the receiving ranks: two collectives for a ResNet
// (float32 statistics, int64 num_batches_tracked). PyTorch's
// _distributed_broadcast_coalesced does the same.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "parallel/comm/communicator.h"
#include "parallel/ddp/debug.h"

namespace loom::ddp {

// See Note [Check shapes before broadcasting]. Collective: every rank calls it. `what`
// names the tensors in messages ("parameter", "buffer"), `who` the caller.
void verify_same_shapes(distributed::Communicator& comm, const std::vector<Tensor>& tensors,
                        const std::vector<std::string>& names, const std::string& what,
                        const std::string& who = "DistributedDataParallel");

// tensors <- rank `root`'s values, one broadcast per dtype (Note [Coalesced broadcast]).
// Collective. Writes under NoGradGuard, so parameters may be among the tensors.
// `announce` is called with each flat tensor right before its broadcast (DDP's detail
// mode; see Note [DDP fingerprints]) and returns what to check before waiting.
void broadcast_coalesced(distributed::Communicator& comm, const std::vector<Tensor>& tensors, int root,
                         const std::function<Announcement(const Tensor& flat)>& announce,
                         const std::vector<std::string>& names);

}  // namespace loom::ddp
