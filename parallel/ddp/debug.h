// LOOM_DISTRIBUTED_DEBUG: what DDP tells you about its collectives (PyTorch's
// TORCH_DISTRIBUTED_DEBUG).
//
//   LOOM_DISTRIBUTED_DEBUG=off     (default) nothing extra
//   LOOM_DISTRIBUTED_DEBUG=info    rank 0 prints the bucket layout at construction
//   LOOM_DISTRIBUTED_DEBUG=detail  also checks that every rank means the same thing by
//                                  each DDP collective (below)
//
// Note [DDP fingerprints]
// The communicator already checks that the ranks' collectives agree in op, dtype and
// shape (Note [Why a fingerprint before every collective] in parallel/comm/op.h), and
// reports a mismatch as "all_reduce #12 of float32 [2359808] on rank 0, ...": true, but
// in the communicator's words. Worse, two buckets of the same size pass that check: if
// rank 0 reduces bucket 1 while rank 1 reduces bucket 2, the gradients are silently
// mixed. In detail mode every DDP collective is announced first with an all_gather of a
// small DDP fingerprint (DDP's own sequence number, iteration, what it is, bucket,
// parameters, dtype, size); before waiting on the collective each rank compares all
// ranks' fingerprints and, on a mismatch, throws an error that lists every rank's view in
// DDP's words (bucket index, parameter names). The gather is queued in front of the
// collective and checked only when DDP waits anyway, so backward is never blocked; the
// cost is one small extra collective per bucket, which is why it is a debug mode.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "parallel/comm/communicator.h"

namespace loom::ddp {

enum class DebugLevel { Off = 0, Info = 1, Detail = 2 };
// LOOM_DISTRIBUTED_DEBUG, read each call; an unknown value is an error naming the choices.
DebugLevel debug_level_from_env();

// What a DDP collective is for. See Note [DDP fingerprints].
enum class CollectivePurpose : int64_t {
  ParameterBroadcast = 0,  // construction: rank 0's parameters and buffers to everyone
  BufferBroadcast = 1,     // forward: rank 0's buffers (BatchNorm running stats)
  BucketAllReduce = 2,     // backward: one gradient bucket
  UsedParameters = 3,      // find_unused_parameters: which parameters each rank used
};

struct CollectiveCall {
  int64_t sequence = 0;   // DDP's own count of its collectives on this rank
  int64_t iteration = 0;  // DDP forwards with gradient sync so far
  CollectivePurpose purpose = CollectivePurpose::BucketAllReduce;
  int64_t bucket = -1;    // bucket index for BucketAllReduce, else -1 (or a dtype group)
  int64_t dtype = 0;
  int64_t numel = 0;
  int64_t num_params = 0;
  int64_t first_param = -1;  // registration indices, for naming
  int64_t last_param = -1;

  std::array<int64_t, 9> words() const;
  static CollectiveCall from_words(const int64_t* words);
  bool operator==(const CollectiveCall& other) const { return words() == other.words(); }
  // "iteration 3: all_reduce of bucket 1 (12 parameters, layer4.0.conv1.weight ... layer3.1.bn2.bias),
  //  float32 [6291456]"; parameter names come from this rank's registration order.
  std::string describe(const std::vector<std::string>& param_names) const;
};

// An announced collective in detail mode: the all_gather of every rank's fingerprint.
class Announcement {
 public:
  Announcement() = default;  // detail mode off: check() does nothing
  Announcement(distributed::Communicator& comm, const CollectiveCall& call);
  // Waits for the fingerprints and throws a loom::Error listing every rank's view if they
  // differ. `names`: this rank's parameter names, by registration index.
  void check(const std::vector<std::string>& names) const;

 private:
  CollectiveCall mine_;
  int rank_ = 0;
  std::vector<Tensor> gathered_;
  std::shared_ptr<distributed::Work> work_;
};

// Numbers DDP's collectives and, in detail mode, announces each one. One per DDP
// instance, shared by its Reducer, so that the sequence counts all of them.
class Announcer {
 public:
  Announcer(distributed::Communicator& comm, DebugLevel level) : comm_(comm), level_(level) {}
  DebugLevel level() const { return level_; }
  // Fills call's sequence, dtype and numel (from `tensor`); an empty Announcement unless
  // the level is Detail. Call it right before issuing the collective itself.
  Announcement announce(CollectiveCall call, const Tensor& tensor);

 private:
  distributed::Communicator& comm_;
  DebugLevel level_;
  int64_t next_sequence_ = 0;
};

}  // namespace loom::ddp
