#include "parallel/comm/op.h"

#include <map>

#include "core/error.h"

namespace loom::distributed {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

const char* op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::AllReduce: return "all_reduce";
    case OpKind::Broadcast: return "broadcast";
    case OpKind::AllGather: return "all_gather";
    case OpKind::ReduceScatter: return "reduce_scatter";
    case OpKind::Barrier: return "barrier";
    case OpKind::Send: return "send";
    case OpKind::Recv: return "recv";
  }
  return "?";
}

static bool has_reduce(int64_t kind) {
  return kind == int64_t(OpKind::AllReduce) || kind == int64_t(OpKind::ReduceScatter);
}

std::string Op::describe() const {
  std::string out = detail::str(op_kind_name(kind), " #", seq);
  if (kind == OpKind::AllReduce || kind == OpKind::ReduceScatter) out += detail::str(" (", reduce_op_name(reduce), ")");
  if (kind == OpKind::Broadcast) out += detail::str(" (root ", peer, ")");
  if (kind == OpKind::Send) out += detail::str(" (to rank ", peer, ", tag ", tag, ")");
  if (kind == OpKind::Recv) out += detail::str(" (from rank ", peer, ", tag ", tag, ")");
  if (tensor.defined()) out += detail::str(" of ", dtype_name(tensor.dtype()), " ", shape_str(tensor.shape()));
  return out + detail::str(" on rank ", rank, " of ", size);
}

// Layout: kind, reduce op, root, dtype, numel, ndim, dims[8], hash of dims beyond 8, id.
Fingerprint fingerprint(const Op& op, int64_t id) {
  Fingerprint f;
  auto& w = f.words;
  w[0] = int64_t(op.kind);
  w[1] = has_reduce(w[0]) ? int64_t(op.reduce) : -1;
  w[2] = op.kind == OpKind::Broadcast ? op.peer : -1;
  w[3] = op.tensor.defined() ? int64_t(op.tensor.dtype()) : -1;
  w[4] = op.tensor.defined() ? op.tensor.numel() : 0;
  w[5] = op.tensor.defined() ? op.tensor.dim() : 0;
  if (op.tensor.defined()) {
    const Shape& shape = op.tensor.shape();
    uint64_t hash = 0;
    for (size_t d = 0; d < shape.size(); ++d) {
      if (d < Fingerprint::kMaxDims) w[6 + d] = shape[d];
      else hash = hash * 1000003u + uint64_t(shape[d]);
    }
    w[14] = int64_t(hash);
  }
  w[15] = id;
  return f;
}

std::string Fingerprint::tensor_str() const {
  if (words[3] < 0) return "no tensor";
  std::string out = detail::str(dtype_name(DType(words[3])), " [");
  for (int64_t d = 0; d < words[5]; ++d) {
    if (d > 0) out += ", ";
    out += d < kMaxDims ? std::to_string(words[6 + d]) : "?";
  }
  return out + "]";
}

std::string Fingerprint::str() const {
  std::string out = op_kind_name(OpKind(words[0]));
  if (has_reduce(words[0])) out += detail::str("(", reduce_op_name(ReduceOp(words[1])), ")");
  if (words[0] == int64_t(OpKind::Broadcast)) out += detail::str("(root ", words[2], ")");
  if (words[0] != int64_t(OpKind::Barrier)) out += " of " + tensor_str();
  return out;
}

bool Fingerprint::same_collective(const Fingerprint& other) const {
  return std::equal(words.begin(), words.begin() + 15, other.words.begin());
}

bool Fingerprint::same_tensor(const Fingerprint& other) const {
  return std::equal(words.begin() + 3, words.begin() + 15, other.words.begin() + 3);
}

void check_same_collective(const std::vector<Fingerprint>& all, const Op& op) {
  bool agree = true;
  for (const auto& f : all) agree = agree && f.same_collective(all[0]);
  if (agree) return;
  // Group ranks by what they called: "all_reduce(sum) of float32 [4] on ranks 0, 2".
  std::map<std::string, std::string> ranks_by_call;
  for (size_t r = 0; r < all.size(); ++r) {
    std::string& ranks = ranks_by_call[all[r].str()];
    ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  }
  std::string calls;
  for (const auto& [call, ranks] : ranks_by_call)
    calls += detail::str("\n  ", call, " on rank", ranks.find(',') == std::string::npos ? " " : "s ", ranks);
  LOOM_FAIL(op.describe(), ": the ranks called different collectives at this point:", calls,
            "\nEvery rank must call the same collectives in the same order, with tensors of the same dtype and "
            "shape. No data was exchanged and the communicator is still usable.");
}

}  // namespace loom::distributed
