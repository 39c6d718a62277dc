#include "parallel/ddp/replica_sync.h"

#include <algorithm>
#include <map>

#include "autograd/grad_mode.h"  // defines: NoGradGuard
#include "autograd/ops.h"        // defines: cat
#include "core/error.h"
#include "core/factory.h"

namespace loom::ddp {
namespace {

// One tensor's description as int64 words: dtype, ndim, dims.
void describe_into(const Tensor& t, std::vector<int64_t>& out) {
  out.push_back(static_cast<int64_t>(t.dtype()));
  out.push_back(t.dim());
  for (int64_t d : t.shape()) out.push_back(d);
}

struct Description {
  DType dtype;
  Shape shape;
  std::string str() const { return detail::str(dtype_name(dtype), " ", shape_str(shape)); }
  bool operator==(const Description& o) const { return dtype == o.dtype && shape == o.shape; }
};

// Parses describe_into's words back: `tensors` descriptions from `length` words.
std::vector<Description> parse(const int64_t* words, size_t tensors, int64_t length) {
  std::vector<Description> out;
  for (int64_t i = 0; out.size() < tensors && i + 1 < length;) {
    const int64_t ndim = std::clamp<int64_t>(words[i + 1], 0, length - i - 2);
    out.push_back(Description{static_cast<DType>(words[i]), Shape(words + i + 2, words + i + 2 + ndim)});
    i += 2 + ndim;
  }
  return out;
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

}  // namespace

void verify_same_shapes(distributed::Communicator& comm, const std::vector<Tensor>& tensors,
                        const std::vector<std::string>& names, const std::string& what,
                        const std::string& who) {
  // Round 1: how many tensors and how many words each rank's description has, so that
  // round 2 can gather same-sized buffers (padded to the longest).
  std::vector<int64_t> words;
  for (const Tensor& t : tensors) describe_into(t, words);
  // See Note [Metadata tensors travel on the communicator's device] (communicator.h).
  std::vector<Tensor> sizes;
  Tensor my_sizes = from_vector<int64_t>({static_cast<int64_t>(tensors.size()), static_cast<int64_t>(words.size())},
                                         {2});
  comm.all_gather(sizes, distributed::to_communication_device(my_sizes, comm))->wait();
  int64_t longest = 0;
  std::map<int64_t, std::vector<int>> ranks_by_count;
  for (int r = 0; r < comm.size(); ++r) {
    auto v = sizes[r].tolist<int64_t>();
    ranks_by_count[v[0]].push_back(r);
    longest = std::max(longest, v[1]);
  }
  if (ranks_by_count.size() > 1) {
    std::string counts;
    for (const auto& [count, ranks] : ranks_by_count) counts += detail::str("\n  ", count, " on ", ranks_text(ranks));
    LOOM_FAIL(who, ": the ranks' models have different numbers of ", what, "s:",
              counts, "\nEvery rank must build the same model. Check that every rank runs the same model-building "
              "code with the same flags");
  }
  Tensor mine = zeros({std::max<int64_t>(longest, 1)}, TensorOptions(kInt64));
  std::copy(words.begin(), words.end(), mine.data_ptr<int64_t>());
  std::vector<Tensor> all;
  comm.all_gather(all, distributed::to_communication_device(mine, comm))->wait();

  std::vector<std::vector<Description>> described;
  for (const Tensor& t : all) {
    const std::vector<int64_t> host = t.tolist<int64_t>();
    described.push_back(parse(host.data(), tensors.size(), t.numel()));
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    std::map<std::string, std::vector<int>> ranks_by_shape;
    for (int r = 0; r < comm.size(); ++r) ranks_by_shape[described[r][i].str()].push_back(r);
    if (ranks_by_shape.size() == 1) continue;
    std::string shapes;
    for (const auto& [shape, ranks] : ranks_by_shape) shapes += detail::str("\n  ", shape, " on ", ranks_text(ranks));
    LOOM_FAIL(who, ": ", what, " ", i, " (\"", names[i], "\" on rank ", comm.rank(), ") differs across ranks:",
              shapes, "\nEvery rank must build the same model before wrapping it; ", who, " checks this before any "
              "rank's values move (see Note [Check shapes before broadcasting])");
  }
}

void broadcast_coalesced(distributed::Communicator& comm, const std::vector<Tensor>& tensors, int root,
                         const std::function<Announcement(const Tensor& flat)>& announce,
                         const std::vector<std::string>& names) {
  // Group by (dtype, device), keeping registration order within each group.
  std::map<std::pair<int, std::string>, std::vector<size_t>> groups;
  for (size_t i = 0; i < tensors.size(); ++i)
    groups[{static_cast<int>(tensors[i].dtype()), tensors[i].device().str()}].push_back(i);
  NoGradGuard no_grad;
  for (const auto& [key, indices] : groups) {
    std::vector<Tensor> flat_pieces;
    for (size_t i : indices) flat_pieces.push_back(tensors[i].detach().reshape({-1}));
    Tensor flat = cat(flat_pieces);  // a fresh contiguous buffer: rank 0's values on rank 0
    Announcement announced = announce ? announce(flat) : Announcement();
    auto work = comm.broadcast(flat, root);
    announced.check(names);
    work->wait();
    if (comm.rank() == root) continue;
    int64_t offset = 0;
    for (size_t i : indices) {
      Tensor t = tensors[i];
      t.copy_(flat.narrow(0, offset, t.numel()).view(t.shape()));
      offset += t.numel();
    }
  }
}

}  // namespace loom::ddp
