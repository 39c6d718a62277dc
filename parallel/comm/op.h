// Op: one communication operation as the backends see it: what it is, its number,
// its tensors, a description for messages, and the fingerprint the ranks compare.
//
// Note [Why a fingerprint before every collective]
// A collective is only correct when every rank calls the same one, in the same order,
// with tensors of the same dtype and shape. When they do not, transports fail badly:
// Gloo, sent more bytes than the receiver posted, aborts the receiving *process*
// (an assertion in its I/O thread), and a mere order mismatch deadlocks until the
// timeout. So before its data moves, every collective all-gathers a 128-byte
// fingerprint (op, reduce op, root, dtype, shape) and every rank checks that all
// agree. Because every rank sees the same fingerprints, every rank takes the same
// decision, and a mismatch is a clean error on all ranks that leaves the communicator
// usable. Point-to-point ops send the fingerprint as a header instead. The price is one
// tiny extra message round per collective, paid for errors that name both shapes.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace loom::distributed {

// As torch.distributed.ReduceOp. Avg is Sum followed by a division by the world size
// (floating dtypes only: an integer average would silently truncate).
enum class ReduceOp : int8_t { Sum = 0, Avg = 1, Max = 2, Min = 3 };
const char* reduce_op_name(ReduceOp op);

enum class OpKind : int8_t { AllReduce = 0, Broadcast, AllGather, ReduceScatter, Barrier, Send, Recv };
const char* op_kind_name(OpKind kind);  // "all_reduce", as the method is spelled
inline bool is_point_to_point(OpKind kind) { return kind == OpKind::Send || kind == OpKind::Recv; }

struct Op {
  OpKind kind = OpKind::Barrier;
  // Collectives and point-to-point ops are numbered separately (#0, #1, ...), so a
  // collective's number is the same on every rank even when ranks exchange different
  // numbers of point-to-point messages.
  uint64_t seq = 0;
  ReduceOp reduce = ReduceOp::Sum;  // all_reduce, reduce_scatter
  int peer = -1;                    // broadcast: root; send: dst; recv: src
  int tag = 0;                      // send, recv
  Tensor tensor{};                  // the in-place / input / output tensor (undefined for barrier)
  std::vector<Tensor> list{};       // all_gather: outputs; reduce_scatter: inputs
  int rank = 0;
  int size = 1;

  // "all_reduce #3 (sum) of float32 [4, 3] on rank 1 of 2"
  std::string describe() const;
};

// See Note [Why a fingerprint before every collective]. 16 little words so that it
// travels as one fixed-size int64 buffer.
struct Fingerprint {
  static constexpr int kMaxDims = 8;
  std::array<int64_t, 16> words{};

  int64_t kind() const { return words[0]; }
  int64_t id() const { return words[15]; }  // point-to-point: the sender's message number
  // The tensor's dtype and shape as they travel ("float32 [4, 3]").
  std::string tensor_str() const;
  // "all_reduce(sum) of float32 [4, 3]"
  std::string str() const;
  // Same op (kind, reduce op, root) on the same dtype and shape; ignores id().
  bool same_collective(const Fingerprint& other) const;
  // Same dtype and shape; what a send and its recv must share.
  bool same_tensor(const Fingerprint& other) const;
};

Fingerprint fingerprint(const Op& op, int64_t id = 0);

// Throws a loom::Error when the fingerprints all-gathered from every rank (index =
// rank) are not all the same collective; the message groups the ranks by what they
// called.
void check_same_collective(const std::vector<Fingerprint>& all, const Op& op);

}  // namespace loom::distributed
