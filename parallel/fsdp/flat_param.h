// FlatParameter: one FSDP unit's parameters as one flat buffer, sharded over a group
// (as PyTorch's torch.distributed.fsdp FlatParameter / FlatParamHandle).
//
//   unit params   conv1.weight (432)  bn1.weight (16)  bn1.bias (16)      total 464
//   flat buffer   [ conv1.weight ......... | bn1.w | bn1.b | pad ]        padded 465 (N = 3)
//   shards        [ rank 0: 155 ][ rank 1: 155 ][ rank 2: 155 ]
//
// Each rank keeps only its shard: a leaf tensor that requires grad, the parameter the
// optimizer steps. The module's own parameters (same TensorImpls as before wrapping, so
// the layers need no change; Note [Parameters keep their identity]) are views into the
// gathered flat buffer while the unit is gathered, and empty ([0]) tensors otherwise.
//
//   gather_async()  all_gather of every rank's shard into the flat buffer (returns at once)
//   wait_gathered() waits, then points the module's parameters at their slices (or, for
//                   shards in symmetric memory, copies every rank's shard itself:
//                   Note [When one-sided gathers may read], runtime.cpp)
//   release()       the parameters become empty again; the buffer's memory is returned
//                   (Note [Releasing a gathered unit])
//   reduce_async()  the parameters' full gradients, divided by the world on the way in,
//                   reduce-scattered into this rank's shard of the gradient
//
// With a shard group of one rank (NO_SHARD) the shard *is* the flat buffer, the module's
// parameters stay views of it for good, and gather/release do nothing.
//
// The per-parameter layout (FSDP2's, fully_shard.h) cuts every parameter on dim 0 instead
// and lays the pieces out in the shard one after the other (Note [Per-parameter shards],
// per_parameter_layout.h). The unit still gathers and reduces as one buffer; the gather
// copies the pieces out of a rank-major staging buffer into the same unsharded buffer,
// and each parameter's piece of the shard is also a leaf tensor of its own (local_shards()),
// the parameter the optimizer steps.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "parallel/comm/communicator.h"         // defines: Communicator, Work
#include "parallel/fsdp/per_parameter_layout.h"  // defines: PerParameterLayout

namespace loom::fsdp {

// Where each parameter sits in the flat buffer, and how it is cut into shards. A pure
// function of the sizes, so that every rank computes the same layout.
// (For the per-parameter layout: offsets and total of the unsharded buffer, the same;
// shard_size that layout's, and padded = group size * shard_size, what a collective moves.)
struct FlatParamLayout {
  std::vector<int64_t> offsets;  // element offset of each parameter in the flat buffer
  int64_t total = 0;             // sum of the parameters' numels
  int64_t padded = 0;            // total rounded up to a multiple of the group size
  int64_t shard_size = 0;        // padded / group size: every rank's shard is this long
};
FlatParamLayout flat_param_layout(const std::vector<int64_t>& numels, int group_size);

class FlatParameter {
 public:
  // params: the unit's parameters that require grad, all of one dtype and device, already
  // equal on every rank (FSDP broadcasts rank 0's first). names: theirs, for messages and
  // the full state dict. shard_group: the ranks that split the unit; a group of size 1
  // keeps the whole flat buffer (NO_SHARD). per_parameter: cut every parameter on dim 0
  // (Note [Per-parameter shards]) rather than the flat buffer.
  FlatParameter(std::vector<Tensor> params, std::vector<std::string> names,
                std::shared_ptr<distributed::Communicator> shard_group, bool per_parameter = false);
  ~FlatParameter();
  FlatParameter(const FlatParameter&) = delete;
  FlatParameter& operator=(const FlatParameter&) = delete;

  const Tensor& shard() const { return shard_; }
  const FlatParamLayout& layout() const { return layout_; }
  const std::vector<Tensor>& params() const { return params_; }
  const std::vector<std::string>& names() const { return names_; }
  const std::vector<Shape>& shapes() const { return shapes_; }  // the parameters' own shapes
  bool sharded() const { return group_ && group_->size() > 1; }
  // ---- the per-parameter layout (Note [Per-parameter shards]) -----------------------------
  bool per_parameter() const { return pieces_.has_value(); }
  const PerParameterLayout& pieces() const;  // per_parameter() only
  // Each parameter's rows on this rank, [rows, rest...]: leaves that require grad, views
  // of the shard (an optimizer's in-place step lands in what the next gather reads; they
  // share its version counter). Empty for the flat layout.
  const std::vector<Tensor>& local_shards() const { return locals_; }
  // What the optimizer steps: local_shards(), or the shard itself for the flat layout.
  std::vector<Tensor> sharded_params() const { return per_parameter() ? locals_ : std::vector<Tensor>{shard_}; }
  // Parameter i's full value ([1] for a 0-d one) from every rank's tensor shaped like its
  // local shard (an optimizer's exp_avg for it, say). Collective over the shard group.
  Tensor gather_full_param(size_t i, const Tensor& local_like) const;
  // This rank's rows of parameter i's full value (shaped as shapes()[i], or [1] for a 0-d
  // one), a new tensor shaped like local_shards()[i].
  Tensor local_of(size_t i, const Tensor& full_param) const;
  // Whether gather_async reads the peers' shards one-sidedly (Note [When one-sided
  // gathers may read], runtime.cpp): the shard lies in symmetric memory, and the FSDP
  // runtime has agreed with every rank to do so (use_one_sided_gathers).
  bool gathers_one_sided() const { return one_sided_; }
  // Chosen once, by every rank together (all with the same value); needs is_symmetric(shard()).
  void use_one_sided_gathers(bool on);

  // ---- parameters ------------------------------------------------------------------
  // Starts the all-gather unless the unit is gathered or one is in flight (or the unit
  // gathers one-sidedly: then wait_gathered copies).
  void gather_async();
  // Waits for the all-gather (starting it if needed; one-sided: copies the shards now);
  // the parameters then hold the full values. Returns when the all-gather finished
  // (ddp::completion_us), -1 if none was needed.
  int64_t wait_gathered();
  bool gathered() const { return gathered_; }
  bool gather_in_flight() const { return gather_work_ != nullptr; }
  // The parameters become empty and the gathered memory is given back. No-op unsharded.
  void release();
  // Bytes of the gathered buffer that occupy memory now: on the CPU the pages the kernel
  // holds for it (mincore), so a release is seen to give them back; elsewhere the
  // buffer's size while FSDP holds one. For memory accounting and tests.
  size_t gathered_resident_bytes() const;
  // The full flat buffer's values (gathered or not): for checkpoints. Collective.
  Tensor full_values() { return gather_full(shard_.detach()); }
  // shard <- this rank's slice of `full` (see shard_of). For loading checkpoints.
  void load_full_values(const Tensor& full);
  // shard <- `shard` ([layout().shard_size], this rank's own, as sharded_state_dict saved
  // it). For loading sharded checkpoints.
  void load_shard_values(const Tensor& shard);
  // For any tensor laid out like the shard (an optimizer's momentum buffer, say): every
  // rank's piece, put in the unsharded buffer's order (each parameter whole, one after
  // the other), without the padding ([layout().total]). Collective over the shard group.
  Tensor gather_full(const Tensor& shard_like) const;
  // This rank's [layout().shard_size] shard of `full` (the unsharded buffer's order:
  // [total] or, flat layout, [padded] elements), padding zero, a new tensor.
  Tensor shard_of(const Tensor& full) const;
  // trace::now_us() when the last all-gather was issued and finished (for the trace).
  int64_t gather_issued_us() const { return gather_issued_us_; }
  // Gathers since construction (all_gathers issued, or one-sided copies), checkpoints'
  // included, and reduce-scatters: what Runtime::comm_counts sums.
  int64_t gathers() const { return gathers_; }
  int64_t reduce_scatters() const { return reduce_scatters_; }

  // ---- gradients ----------------------------------------------------------------------
  // Called from parameter i's post-accumulate-grad hook; true when every parameter of
  // the unit has its gradient for this backward.
  bool mark_ready(size_t index);
  void reset_ready();
  size_t ready_count() const { return ready_count_; }
  // Copies the parameters' gradients into a flat buffer, divided by `world` (Note
  // [Divide on the way in], parallel/ddp/reducer.cpp), drops them (they are full-size),
  // and starts the reduce-scatter into this rank's shard. Returns its Work.
  std::shared_ptr<distributed::Work> reduce_async(int world);
  // The reduced shard of the gradient of the last reduce_async (valid once its Work is done).
  const Tensor& reduced_grad() const { return reduced_grad_; }
  // Adds reduced_grad() to the gradients of sharded_params() (sets it where they have none):
  // the shard's, or each local shard's rows of it.
  void accumulate_reduced_grad() const;

 private:
  void point_params_at(const Tensor& flat);
  void ensure_full_buffer();  // full_ and full_chunks_, allocated on first use (non-CPU devices: after each release)
  int64_t full_numel() const { return per_parameter() ? layout_.total : layout_.padded; }
  // all_gather's outputs: full_chunks_, or a rank-major staging buffer (per-parameter layout).
  std::vector<Tensor>& gather_outputs();
  void finish_gather();  // per-parameter layout: the staging buffer's pieces to full_
  void make_local_shards(int rank);  // per-parameter layout: locals_, views of shard_
  void fill_rank_major_grads(const Tensor& flat, int world) const;
  void charge_gathered();     // full_'s pages against the device's budget while gathered (CPU)
  void drain() noexcept;

  std::vector<Tensor> params_;
  std::vector<std::string> names_;
  std::vector<Shape> shapes_;
  std::shared_ptr<distributed::Communicator> group_;
  FlatParamLayout layout_;
  Tensor shard_;
  Tensor full_;            // the gathered buffer (sharded units); see Note [Releasing a gathered unit]
  bool full_releasable_ = false;
  std::shared_ptr<void> gathered_charge_;  // see charge_gathered
  std::vector<Tensor> full_chunks_;  // full_ cut into group-size shards: all_gather's outputs (flat layout)
  std::optional<PerParameterLayout> pieces_;  // per-parameter layout only
  std::vector<Tensor> locals_;                // per-parameter layout only: see local_shards()
  Tensor staging_;                            // per-parameter layout: every rank's shard, while a gather runs
  std::vector<Tensor> staging_chunks_;
  std::shared_ptr<distributed::Work> gather_work_;
  bool gathered_ = false;
  bool one_sided_ = false;
  int64_t gather_issued_us_ = -1;
  int64_t gathers_ = 0, reduce_scatters_ = 0;
  std::vector<char> ready_;
  size_t ready_count_ = 0;
  Tensor reduced_grad_;
  std::shared_ptr<distributed::Work> reduce_work_;
};

}  // namespace loom::fsdp
