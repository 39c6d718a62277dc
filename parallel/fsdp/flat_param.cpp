#include "parallel/fsdp/flat_param.h"

#include <sys/mman.h>  // defines: mmap, madvise, mincore
#include <unistd.h>    // defines: sysconf

#include <algorithm>
#include <cstdint>  // defines: uintptr_t

#include "autograd/grad_mode.h"    // defines: NoGradGuard
#include "core/error.h"
#include "core/factory.h"          // defines: zeros, empty
#include "core/memory.h"           // defines: reserve_external_memory
#include "core/trace.h"            // defines: trace::now_us
#include "nn/module.h"             // defines: nn::set_data, nn::Parameter
#include "parallel/ddp/reducer.h"  // defines: copy_divided

namespace loom::fsdp {

using distributed::ReduceOp;

FlatParamLayout flat_param_layout(const std::vector<int64_t>& numels, int group_size) {
  LOOM_CHECK(group_size >= 1, "flat_param_layout: the group size must be at least 1, got ", group_size);
  FlatParamLayout layout;
  for (int64_t n : numels) {
    layout.offsets.push_back(layout.total);
    layout.total += n;
  }
  // Note [Padding the flat buffer]
  // all_gather and reduce_scatter move equal-sized pieces, so the flat buffer is padded
  // with zeros to a multiple of the group size: 464 elements over 3 ranks become 3
  // shards of 155, the last holding one padding element. The padding's gradient is zero
  // and so is its weight decay, so it stays zero through every optimizer step.
  layout.shard_size = (layout.total + group_size - 1) / group_size;
  layout.padded = layout.shard_size * group_size;
  return layout;
}

// Note [Releasing a gathered unit]
// FULL_SHARD frees a unit's gathered parameters after its forward and gathers them again
// before its backward. But the layers' backward formulas do not read the module's
// parameters: autograd saved its own alias of what they need (Note [Saved tensors]),
// sharing the gathered buffer's storage. Dropping FSDP's handles therefore frees nothing
// while that alias lives, until backward passes the unit. PyTorch frees the memory under
// the aliases instead (the storage is resized to 0 and back). loom does the same on the
// CPU without touching the storage object: the gathered buffer is an anonymous mapping
// that stays at one address; release() hands its pages back to the kernel
// (madvise(MADV_DONTNEED): resident memory drops, a later read would see zeros) and the
// backward's all-gather writes the values back into the same pages, under the aliases.
// On other devices the buffer is simply dropped and the next gather allocates a new one;
// the aliases then keep the forward's copy alive until the unit's backward.
namespace {

size_t page_size() {
  static const size_t size = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return size;
}

// Note [Huge pages for gathered units]
// Every gather after a release() faults the unit's pages back in, one page fault per
// 4 KiB page, each of which the kernel zeroes: 22,000 faults per ResNet18 step at two
// ranks. On this project's VM (where a fault also walks the hypervisor's page tables)
// that was 145 ms of system time per step on the communicator thread, taken from the
// rank's training thread (measured by /proc/<pid>/task/<tid>/stat: FSDP's communicator
// thread used 300 ms of CPU per step, DDP's 10 ms). A buffer of at least one huge page
// therefore starts on a 2 MiB boundary, is a whole number of huge pages long, and is
// marked MADV_HUGEPAGE, so that the kernel backs it with 2 MiB pages (where transparent
// huge pages are "always" or "madvise", Linux's default): a fault per 2 MiB.
// MADV_DONTNEED over whole huge pages still frees them. Smaller buffers keep 4 KiB pages:
// a huge page would make a 7 KiB unit cost 2 MiB while gathered.
constexpr size_t kHugePage = size_t(2) << 20;

size_t granule(size_t nbytes) { return nbytes >= kHugePage ? kHugePage : page_size(); }

size_t mapped_bytes(size_t nbytes) {
  const size_t g = granule(nbytes == 0 ? 1 : nbytes);
  return (std::max<size_t>(nbytes, 1) + g - 1) / g * g;
}

Tensor map_releasable(int64_t numel, DType dtype, Device device) {
  const size_t nbytes = static_cast<size_t>(numel) * element_size(dtype);
  const size_t length = mapped_bytes(nbytes);
  const size_t align = granule(nbytes);
  const size_t reserved = length + (align > page_size() ? align : 0);  // room to slide to a 2 MiB boundary
  void* base = ::mmap(nullptr, reserved, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  LOOM_CHECK(base != MAP_FAILED, "FSDP: could not map ", reserved, " bytes for a unit's gathered parameters");
  const auto address = reinterpret_cast<uintptr_t>(base);
  void* data = reinterpret_cast<void*>((address + align - 1) / align * align);
  if (align > page_size()) ::madvise(data, length, MADV_HUGEPAGE);  // advice: ignored where THP is off
  std::shared_ptr<void> owner(data, [base, reserved](void*) { ::munmap(base, reserved); });
  auto storage = std::make_shared<StorageImpl>(data, nbytes, device, std::move(owner));
  return make_tensor(std::move(storage), {numel}, {1}, 0, dtype);
}

void release_pages(const Tensor& buffer) {
  ::madvise(buffer.storage()->data(), mapped_bytes(buffer.storage()->nbytes()), MADV_DONTNEED);
}

}  // namespace

size_t FlatParameter::gathered_resident_bytes() const {
  if (!sharded() || !full_.defined()) return 0;
  if (!full_releasable_) return full_.nbytes();
  const size_t length = mapped_bytes(full_.storage()->nbytes());
  std::vector<unsigned char> pages(length / page_size());
  LOOM_CHECK(::mincore(full_.storage()->data(), length, pages.data()) == 0, "FSDP: mincore failed on a gathered "
             "buffer");
  size_t resident = 0;
  for (unsigned char page : pages) resident += (page & 1) ? page_size() : 0;
  return std::min(resident, full_.nbytes());
}

FlatParameter::FlatParameter(std::vector<Tensor> params, std::vector<std::string> names,
                             std::shared_ptr<distributed::Communicator> shard_group, bool per_parameter)
    : params_(std::move(params)), names_(std::move(names)), group_(std::move(shard_group)) {
  LOOM_CHECK(!params_.empty(), "FlatParameter: a unit needs at least one parameter");
  LOOM_CHECK(names_.size() == params_.size(), "FlatParameter: ", params_.size(), " parameters but ", names_.size(),
             " names");
  const DType dtype = params_[0].dtype();
  const Device device = params_[0].device();
  std::vector<int64_t> numels;
  for (size_t i = 0; i < params_.size(); ++i) {
    LOOM_CHECK(params_[i].dtype() == dtype && params_[i].device() == device, "FSDP: the parameters of one unit "
               "must share a dtype and a device to live in one flat buffer; \"", names_[i], "\" is ",
               params_[i].str(), " but \"", names_[0], "\" is ", params_[0].str());
    shapes_.push_back(params_[i].shape());
    numels.push_back(params_[i].numel());
  }
  const int world = group_ ? group_->size() : 1;
  const int rank = group_ ? group_->rank() : 0;
  layout_ = flat_param_layout(numels, world);
  if (per_parameter) {  // See Note [Per-parameter shards]
    pieces_ = per_parameter_layout(shapes_, world);
    layout_.shard_size = pieces_->shard_size;
    layout_.padded = pieces_->shard_size * world;
  }
  ready_.assign(params_.size(), 0);

  NoGradGuard no_grad;
  const TensorOptions options = TensorOptions(dtype).device(device);
  Tensor flat = zeros({full_numel()}, options);
  for (size_t i = 0; i < params_.size(); ++i)
    flat.narrow(0, layout_.offsets[i], numels[i]).view(shapes_[i]).copy_(params_[i].contiguous());
  if (!sharded()) {
    // (With one rank the per-parameter layout is the flat one: every piece is its whole
    // parameter, at its offset in the flat buffer.)
    shard_ = nn::Parameter(flat);
    point_params_at(shard_.detach());  // NO_SHARD: the module's parameters are the flat buffer, for good
    make_local_shards(0);
    gathered_ = true;
    return;
  }
  // Note [Shards in symmetric memory]
  // Every rank makes its units' FlatParameters in the same order, so the shards can be
  // allocated together, in symmetric memory (Note [Symmetric memory], communicator.h):
  // then an all-gather reads every rank's shard where it lies instead of copying each
  // into a staging area first (Note [Symmetric all_gather], shm_collectives.cpp). Where
  // the backend has none (NCCL, TCP), this is an ordinary tensor.
  Tensor shard = group_->zeros_symmetric({layout_.shard_size}, options);
  if (pieces_) pack_shard(*pieces_, flat, rank, shard);
  else shard.copy_(flat.narrow(0, rank * layout_.shard_size, layout_.shard_size));
  shard_ = nn::Parameter(shard);
  make_local_shards(rank);
  full_releasable_ = device.is_cpu();
  if (full_releasable_) {
    full_ = map_releasable(full_numel(), dtype, device);
    if (!pieces_) full_chunks_ = full_.chunk(world);
  }
  gathered_ = true;  // the parameters still hold their full values: release() empties them
  release();
}

FlatParameter::~FlatParameter() { drain(); }

void FlatParameter::make_local_shards(int rank) {
  if (!pieces_) return;
  const Tensor shard = shard_.detach();
  for (size_t i = 0; i < params_.size(); ++i) {
    const Shape local = pieces_->local_shape(i, shapes_[i], rank);
    locals_.push_back(nn::Parameter(shard.narrow(0, pieces_->pieces[i].offset, numel(local)).view(local)));
  }
}

const PerParameterLayout& FlatParameter::pieces() const {
  LOOM_CHECK(pieces_.has_value(), "FlatParameter::pieces: this unit has the flat layout; only a per-parameter one "
             "(FSDPOptions::per_parameter_sharding, fsdp::fully_shard) has pieces");
  return *pieces_;
}

void FlatParameter::drain() noexcept {
  for (auto* work : {&gather_work_, &reduce_work_}) {
    if (!*work) continue;
    try {
      (*work)->wait();
    } catch (...) {  // reported by whoever waited first
    }
    *work = nullptr;
  }
}

void FlatParameter::point_params_at(const Tensor& flat) {
  NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i)
    nn::set_data(params_[i], flat.narrow(0, layout_.offsets[i], numel(shapes_[i])).view(shapes_[i]));
}

void FlatParameter::ensure_full_buffer() {
  if (full_.defined()) return;
  full_ = empty({full_numel()}, TensorOptions(shard_.dtype()).device(shard_.device()));
  if (!pieces_) full_chunks_ = full_.chunk(group_->size());
}

// The flat layout gathers straight into full_. The per-parameter one gathers rank-major
// (every rank's shard after the other) and copies each piece to its parameter's place in
// full_ afterwards (Note [Per-parameter shards]); full_ stays what the parameters view and
// what release() gives back (Note [Releasing a gathered unit]). The staging buffer lives
// from the gather's issue to its end only.
std::vector<Tensor>& FlatParameter::gather_outputs() {
  if (!pieces_) return full_chunks_;
  staging_ = empty({layout_.padded}, TensorOptions(shard_.dtype()).device(shard_.device()));
  staging_chunks_ = staging_.chunk(group_->size());
  return staging_chunks_;
}

void FlatParameter::finish_gather() {
  if (!pieces_) return;
  unpack_shards(*pieces_, staging_, full_);
  staging_ = Tensor();
  staging_chunks_.clear();
}

// On the CPU the gathered buffer is mapped memory whose pages come and go with each gather
// and release (Note [Releasing a gathered unit]), not the caching allocator's: it counts
// against the device's budget and in its statistics from the gather to the release, as
// the allocator's blocks would (Note [Device memory budget], core/memory.h).
void FlatParameter::charge_gathered() {
  if (full_releasable_ && !gathered_charge_)
    gathered_charge_ = reserve_external_memory(static_cast<int64_t>(full_.nbytes()), full_.device());
}

void FlatParameter::gather_async() {
  // One-sided gathers copy when the unit is needed, on the caller's thread (see
  // wait_gathered): a prefetch would only hold the memory longer.
  if (!sharded() || gathered_ || gather_work_ || one_sided_) return;
  ensure_full_buffer();
  charge_gathered();
  gather_issued_us_ = trace::now_us();
  ++gathers_;
  gather_work_ = group_->all_gather(gather_outputs(), shard_.detach());
}

void FlatParameter::use_one_sided_gathers(bool on) {
  LOOM_CHECK(!on || (sharded() && group_->is_symmetric(shard_)), "FlatParameter: one-sided gathers need a shard in "
             "symmetric memory");
  one_sided_ = on;
}

int64_t FlatParameter::wait_gathered() {
  if (gathered_) return -1;
  if (one_sided_) {  // Note [When one-sided gathers may read] (runtime.cpp)
    ensure_full_buffer();
    charge_gathered();
    gather_issued_us_ = trace::now_us();
    ++gathers_;
    group_->all_gather_one_sided(gather_outputs(), shard_.detach());
    finish_gather();
    point_params_at(full_);
    gathered_ = true;
    return trace::now_us();
  }
  gather_async();
  auto work = std::move(gather_work_);
  gather_work_ = nullptr;
  work->wait();
  finish_gather();
  point_params_at(full_);
  gathered_ = true;
  return ddp::completion_us(*work);
}

void FlatParameter::release() {
  if (!sharded()) return;
  if (gather_work_) wait_gathered();  // never give back pages an all-gather is writing
  if (!gathered_) return;
  NoGradGuard no_grad;
  const Tensor nothing = empty({0}, TensorOptions(shard_.dtype()).device(shard_.device()));
  for (const Tensor& p : params_) nn::set_data(p, nothing);
  if (full_releasable_) {
    release_pages(full_);  // See Note [Releasing a gathered unit]
    gathered_charge_.reset();
  } else {
    full_ = Tensor();
    full_chunks_.clear();
  }
  gathered_ = false;
}

Tensor FlatParameter::gather_full(const Tensor& shard_like) const {
  LOOM_CHECK(shard_like.shape() == shard_.shape(), "FlatParameter::gather_full: expected a tensor shaped like the shard ",
             shard_.shape(), ", got ", shard_like.str());
  if (!sharded()) return shard_like.narrow(0, 0, layout_.total).clone();
  Tensor out = empty({layout_.padded}, TensorOptions(shard_like.dtype()).device(shard_like.device()));
  std::vector<Tensor> chunks = out.chunk(group_->size());
  group_->all_gather(chunks, shard_like.contiguous())->wait();
  if (!pieces_) return out.narrow(0, 0, layout_.total);
  Tensor full = empty({layout_.total}, TensorOptions(shard_like.dtype()).device(shard_like.device()));
  unpack_shards(*pieces_, out, full);
  return full;
}

Tensor FlatParameter::shard_of(const Tensor& full) const {
  LOOM_CHECK(full.dim() == 1 && (full.numel() == layout_.total || full.numel() == layout_.padded),
             "FlatParameter: expected a flat tensor of ", layout_.total, " (or padded ", layout_.padded,
             ") values, got ", full.str());
  NoGradGuard no_grad;
  const int rank = group_ ? group_->rank() : 0;
  if (pieces_) {
    Tensor shard = empty({layout_.shard_size}, TensorOptions(full.dtype()).device(full.device()));
    pack_shard(*pieces_, full, rank, shard);
    return shard;
  }
  Tensor padded = zeros({layout_.padded}, TensorOptions(full.dtype()).device(full.device()));
  padded.narrow(0, 0, layout_.total).copy_(full.narrow(0, 0, layout_.total));
  return padded.narrow(0, rank * layout_.shard_size, layout_.shard_size).clone();
}

Tensor FlatParameter::gather_full_param(size_t i, const Tensor& local_like) const {
  const ParameterPiece& piece = pieces().pieces.at(i);
  const Tensor& local = locals_[i];
  LOOM_CHECK(local_like.shape() == local.shape(), "FlatParameter::gather_full_param: expected a tensor shaped like "
             "the local shard of \"", names_[i], "\", ", local.shape(), ", got ", local_like.str());
  const Shape full_shape = shapes_[i].empty() ? Shape{1} : shapes_[i];
  if (!sharded()) return local_like.clone().view(full_shape);
  // Every rank's piece travels padded to chunk_rows rows, as the unit's shards do.
  NoGradGuard no_grad;
  const TensorOptions options = TensorOptions(local_like.dtype()).device(local_like.device());
  Tensor padded = zeros({piece.numel()}, options);
  if (local.numel() > 0) padded.narrow(0, 0, local.numel()).copy_(local_like.reshape({-1}));
  std::vector<Tensor> gathered;
  group_->all_gather(gathered, padded)->wait();
  Tensor full = empty({numel(full_shape)}, options);
  for (int r = 0; r < group_->size(); ++r) {
    const distributed::ShardRange rows = pieces_->rows_of(i, r);
    const int64_t values = rows.length * piece.row_numel;
    if (values > 0) full.narrow(0, rows.offset * piece.row_numel, values).copy_(gathered[r].narrow(0, 0, values));
  }
  return full.view(full_shape);
}

Tensor FlatParameter::local_of(size_t i, const Tensor& full_param) const {
  const int64_t row_numel = pieces().pieces.at(i).row_numel;
  const Tensor& local = locals_[i];
  LOOM_CHECK(full_param.numel() == numel(shapes_[i]) && (full_param.shape() == shapes_[i] || full_param.dim() == 1),
             "FlatParameter::local_of: expected the full value of \"", names_[i], "\", ", shapes_[i], ", got ",
             full_param.str());
  const int rank = group_ ? group_->rank() : 0;
  const distributed::ShardRange rows = pieces_->rows_of(i, rank);
  return full_param.reshape({-1}).narrow(0, rows.offset * row_numel, rows.length * row_numel).clone().view(local.shape());
}

void FlatParameter::load_full_values(const Tensor& full) {
  LOOM_CHECK(full.dtype() == shard_.dtype(), "FlatParameter::load_full_values: expected ", shard_.dtype(),
             " values, got ", full.str());
  load_shard_values(shard_of(full.to(shard_.device())));
}

void FlatParameter::load_shard_values(const Tensor& shard) {
  LOOM_CHECK(shard.dtype() == shard_.dtype() && shard.shape() == shard_.shape(), "FlatParameter::load_shard_values: "
             "expected this rank's shard, ", shard_.dtype(), " ", shard_.shape(), ", got ", shard.str());
  NoGradGuard no_grad;
  Tensor(shard_.detach()).copy_(shard.to(shard_.device()));
  shard_.bump_version();
  if (sharded()) release();  // the next forward gathers the loaded values
}

bool FlatParameter::mark_ready(size_t index) {
  LOOM_CHECK(!ready_.at(index), "FSDP: parameter \"", names_[index], "\" received its gradient twice in one "
             "backward; a parameter must be used by one unit's forward only (is it shared with another unit, or "
             "used outside the FSDP module?)");
  ready_[index] = 1;
  return ++ready_count_ == params_.size();
}

void FlatParameter::reset_ready() {
  ready_.assign(params_.size(), 0);
  ready_count_ = 0;
}

std::shared_ptr<distributed::Work> FlatParameter::reduce_async(int world) {
  NoGradGuard no_grad;
  // Every value is written once: the gradients (divided) where they are, zeros in the
  // padding and for a parameter without a gradient. (Zero-filling the whole buffer first
  // was one more pass over the unit's memory per backward.)
  Tensor flat = empty({layout_.padded}, TensorOptions(shard_.dtype()).device(shard_.device()));
  if (pieces_) {
    fill_rank_major_grads(flat, world);
  } else {
    flat.narrow(0, layout_.total, layout_.padded - layout_.total).zero_();
    for (size_t i = 0; i < params_.size(); ++i) {
      const Tensor grad = params_[i].grad();
      Tensor slot = flat.narrow(0, layout_.offsets[i], numel(shapes_[i]));
      if (grad.defined()) ddp::copy_divided(slot.view(shapes_[i]), grad, world);
      else slot.zero_();
    }
  }
  for (const Tensor& p : params_) p.set_grad(Tensor());  // the full-size gradient is not kept: only the shard's
  if (!sharded()) {
    reduced_grad_ = flat;
    reduce_work_ = nullptr;
    return nullptr;
  }
  reduced_grad_ = empty({layout_.shard_size}, TensorOptions(shard_.dtype()).device(shard_.device()));
  ++reduce_scatters_;
  reduce_work_ = group_->reduce_scatter(reduced_grad_, flat.chunk(group_->size()), ReduceOp::Sum);
  return reduce_work_;
}

// The per-parameter layout's reduce: every rank's piece of every gradient, divided by the
// world on the way in as the flat layout's (so both agree bitwise with DDP), at its slot of
// the rank-major buffer that reduce_scatter cuts into shards; the padding zero.
void FlatParameter::fill_rank_major_grads(const Tensor& flat, int world) const {
  const PerParameterLayout& layout = *pieces_;
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParameterPiece& piece = layout.pieces[i];
    const Tensor grad = params_[i].grad();
    // [rows, row_numel]: a view of a contiguous gradient (a 0-d one as [1, 1]).
    const Tensor rows_of_grad = grad.defined() ? grad.reshape({piece.rows, piece.row_numel}) : Tensor();
    for (int r = 0; r < layout.group_size; ++r) {
      Tensor slot = flat.narrow(0, layout.slot(i, r), piece.numel());
      const distributed::ShardRange rows = layout.rows_of(i, r);
      const int64_t values = grad.defined() ? rows.length * piece.row_numel : 0;
      if (values > 0)
        ddp::copy_divided(slot.narrow(0, 0, values).view({rows.length, piece.row_numel}),
                          rows_of_grad.narrow(0, rows.offset, rows.length), world);
      if (values < piece.numel()) slot.narrow(0, values, piece.numel() - values).zero_();
    }
  }
}

void FlatParameter::accumulate_reduced_grad() const {
  NoGradGuard no_grad;
  auto accumulate = [](const Tensor& param, const Tensor& reduced) {
    Tensor grad = param.grad();
    if (grad.defined()) grad.add_(reduced);
    else param.set_grad(reduced);
  };
  if (!pieces_) return accumulate(shard_, reduced_grad_);
  for (size_t i = 0; i < locals_.size(); ++i)  // each local shard's grad: a view of its piece
    accumulate(locals_[i], reduced_grad_.narrow(0, pieces_->pieces[i].offset, locals_[i].numel()).view(locals_[i].shape()));
}

}  // namespace loom::fsdp
