#include "parallel/comm/communicator.h"

#include "core/error.h"
#include "core/factory.h"  // defines: zeros
#include "parallel/comm/traffic.h"  // defines: record_traffic

namespace loom::distributed {

Communicator::Communicator(int rank, int size, std::chrono::milliseconds timeout)
    : rank_(rank), size_(size), timeout_(timeout) {
  LOOM_CHECK(size >= 1, "communicator: expected a world size >= 1, got ", size);
  LOOM_CHECK(rank >= -1 && rank < size, "communicator: expected a rank in [0, ", size, ") (or -1 on a rank that is "
             "not a member), got ", rank);
  LOOM_CHECK(timeout.count() > 0, "communicator: the timeout must be positive, got ", timeout.count(), " ms");
}

// The checks every backend needs, in one place: a tensor a collective can move as one
// flat buffer of bytes.
static void check_buffer(const Tensor& t, const char* op, const char* which) {
  LOOM_CHECK(t.defined(), op, ": the ", which, " tensor is undefined (a default-constructed Tensor)");
  LOOM_CHECK(t.is_contiguous(), op, ": the ", which, " tensor ", t.str(), " is not contiguous; communication moves "
             "one flat buffer. Pass t.contiguous() (and copy_ the result back for in-place ops)");
}

static void check_like(const Tensor& t, const Tensor& like, const char* op, const char* which, size_t index) {
  check_buffer(t, op, which);
  LOOM_CHECK(t.dtype() == like.dtype() && t.shape() == like.shape() && t.device() == like.device(), op, ": ", which,
             "[", index, "] is ", t.str(), " but must match ", like.str());
}

static void check_reduce(const Tensor& t, ReduceOp op, const char* name) {
  LOOM_CHECK(op != ReduceOp::Avg || is_floating(t.dtype()), name, ": ReduceOp::Avg of a ", dtype_name(t.dtype()),
             " tensor would truncate; use ReduceOp::Sum and divide, or reduce a floating tensor");
}

void Communicator::check_member(const char* op) const {
  LOOM_CHECK(is_member(), op, " on process group '", group_name_, "' (", size_, " ranks): this rank is not a member "
             "of it. Every rank calls new_group() for every group, but only the ranks it lists may use it; "
             "check is_member() first, or pick the group that holds this rank (DeviceMesh::group)");
}

// S of Note [Bytes a collective moves] (traffic.h): the whole buffer the collective is
// about, which for all_gather and reduce_scatter is the list, not this rank's piece.
static int64_t payload_bytes(const Op& op) {
  if (op.kind == OpKind::Barrier) return 0;
  if (op.kind == OpKind::AllGather || op.kind == OpKind::ReduceScatter)
    return static_cast<int64_t>(op.tensor.nbytes()) * op.size;
  return static_cast<int64_t>(op.tensor.nbytes());
}

std::shared_ptr<Work> Communicator::issue(Op op) {
  op.rank = rank_;
  op.size = size_;
  const OpKind kind = op.kind;
  const int64_t payload = payload_bytes(op);
  std::shared_ptr<Work> work;
  {
    std::lock_guard<std::mutex> lock(issue_mutex_);
    op.seq = is_point_to_point(op.kind) ? p2p_seq_++ : collective_seq_++;
    work = launch(std::move(op));
  }
  // Counted once launched: an op the backend refused moved nothing.
  record_traffic(traffic_, kind, payload, size_);
  return work;
}

std::shared_ptr<Work> Communicator::all_reduce(const Tensor& tensor, ReduceOp op) {
  check_member("all_reduce");
  check_buffer(tensor, "all_reduce", "input");
  check_reduce(tensor, op, "all_reduce");
  return issue(Op{.kind = OpKind::AllReduce, .reduce = op, .tensor = tensor});
}

std::shared_ptr<Work> Communicator::broadcast(const Tensor& tensor, int root) {
  check_member("broadcast");
  check_buffer(tensor, "broadcast", "input");
  LOOM_CHECK(root >= 0 && root < size_, "broadcast: expected a root rank in [0, ", size_, "), got ", root);
  return issue(Op{.kind = OpKind::Broadcast, .peer = root, .tensor = tensor});
}

void Communicator::check_all_gather(std::vector<Tensor>& out, const Tensor& in, const char* name) const {
  check_member(name);
  check_buffer(in, name, "input");
  if (out.empty()) {
    for (int r = 0; r < size_; ++r) out.push_back(empty(in.shape(), TensorOptions(in.dtype()).device(in.device())));
  }
  LOOM_CHECK(out.size() == size_t(size_), name, ": the output list holds ", out.size(),
             " tensors but the world size is ", size_, "; pass one per rank (or an empty list)");
  for (size_t r = 0; r < out.size(); ++r) check_like(out[r], in, name, "output", r);
}

std::shared_ptr<Work> Communicator::all_gather(std::vector<Tensor>& out, const Tensor& in) {
  check_all_gather(out, in, "all_gather");
  return issue(Op{.kind = OpKind::AllGather, .tensor = in, .list = out});
}

void Communicator::all_gather_one_sided(std::vector<Tensor>& out, const Tensor& in) {
  check_all_gather(out, in, "all_gather_one_sided");
  LOOM_CHECK(is_symmetric(in), "all_gather_one_sided: the input must lie in symmetric memory, where every rank can "
             "read it (a piece of a zeros_symmetric tensor, on a ", backend(), " group whose ranks share a host); got ",
             in.str(), " in ordinary memory. Use all_gather, which every rank takes part in");
  copy_one_sided(out, in);
  // Counted as the all_gather it replaces; see Note [Bytes a collective moves] (traffic.h).
  record_traffic(traffic_, OpKind::AllGather, static_cast<int64_t>(in.nbytes()) * size_, size_);
}

void Communicator::copy_one_sided(std::vector<Tensor>&, const Tensor&) {
  LOOM_FAIL("all_gather_one_sided: the ", backend(), " backend has no symmetric memory");
}

std::shared_ptr<Work> Communicator::reduce_scatter(const Tensor& out, const std::vector<Tensor>& in, ReduceOp op) {
  check_member("reduce_scatter");
  check_buffer(out, "reduce_scatter", "output");
  check_reduce(out, op, "reduce_scatter");
  LOOM_CHECK(in.size() == size_t(size_), "reduce_scatter: the input list holds ", in.size(),
             " tensors but the world size is ", size_, "; pass one per rank (in[r] is reduced into rank r's output)");
  for (size_t r = 0; r < in.size(); ++r) check_like(in[r], out, "reduce_scatter", "input", r);
  return issue(Op{.kind = OpKind::ReduceScatter, .reduce = op, .tensor = out, .list = in});
}

static void check_peer(int peer, int rank, int size, int tag, const char* op, const char* role) {
  LOOM_CHECK(peer >= 0 && peer < size, op, ": expected a ", role, " rank in [0, ", size, "), got ", peer);
  LOOM_CHECK(peer != rank, op, ": rank ", rank, " cannot ", op, " with itself; copy the tensor instead");
  LOOM_CHECK(tag >= 0, op, ": expected a tag >= 0, got ", tag);
}

std::shared_ptr<Work> Communicator::send(const Tensor& tensor, int dst, int tag) {
  check_member("send");
  check_buffer(tensor, "send", "input");
  check_peer(dst, rank_, size_, tag, "send", "destination");
  return issue(Op{.kind = OpKind::Send, .peer = dst, .tag = tag, .tensor = tensor});
}

std::shared_ptr<Work> Communicator::recv(const Tensor& tensor, int src, int tag) {
  check_member("recv");
  check_buffer(tensor, "recv", "output");
  check_peer(src, rank_, size_, tag, "recv", "source");
  return issue(Op{.kind = OpKind::Recv, .peer = src, .tag = tag, .tensor = tensor});
}

std::shared_ptr<Work> Communicator::barrier() {
  check_member("barrier");
  return issue(Op{.kind = OpKind::Barrier});
}

Tensor Communicator::zeros_symmetric(const Shape& shape, TensorOptions options) { return zeros(shape, options); }

bool Communicator::is_symmetric(const Tensor&) const { return false; }

Tensor to_communication_device(const Tensor& host, const Communicator& comm) {
  const Device device = comm.tensor_device();
  return host.device() == device ? host : host.to(device);
}

}  // namespace loom::distributed
