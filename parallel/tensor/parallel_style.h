// Parallel styles: how tensor parallelism splits one layer, with the names and defaults of
// torch.distributed.tensor.parallel. parallelize_module (parallelize_module.h) applies
// them to the layers a plan names.
//
//   ColwiseParallel()   Linear / Conv2d: the weight's output features (rows, Shard(0)) split;
//                       input Replicate() -> each rank's slice of the output features
//   RowwiseParallel()   Linear / Conv2d: the weight's input features (Shard(1)) split; input a
//                       slice of the features -> output Partial(), all-reduced to Replicate()
//   ChannelParallel()   BatchNorm2d: its per-channel state split as its input's channels
//   PrepareModuleInput  move any module's input from one placement to another
//   PrepareModuleOutput move any module's output from one placement to another
//
// The Megatron pair, and a ResNet block (resnet_plan.h):
//
//   x (Replicate) -f-> conv1 colwise -> y1 (Shard(1): this rank's channels)
//                      bn1 channel-parallel, relu: on this rank's channels only
//                      conv2 rowwise -> partial sum -g-> y2 (Replicate) -> bn2, + shortcut
//
// f is the identity forward and an all-reduce of the input's gradient backward; g the
// all-reduce forward and the identity backward (DTensor::to_local(Partial()) and
// redistribute(Partial() -> Replicate()), dtensor.h).
//
// Note [Feature dims of Linear and Conv2d]
// PyTorch's styles are written for Linear, whose features are the last dim: ColwiseParallel's
// output and RowwiseParallel's input default to Shard(-1). A Conv2d's features (channels)
// are dim 1 of NCHW, so for a Conv2d the same defaults are Shard(1). A layout given
// explicitly is used as given.
//
// Note [One f for q, k and v]
// Attention reads its input three times, through q_proj, k_proj and v_proj. Each
// column-parallel projection's own f would all-reduce its share of the input's gradient:
// three all-reduces of [N, L, D] in backward where one does, since the three shares add up
// before anything else reads them. So a plan may put f on the attention module instead
// (PrepareModuleInput(Replicate(), Replicate(), /*reduce_grad=*/true)) and tell the
// projections to leave their input gradients partial (ColwiseParallel({.reduce_input_grad =
// false})): the sum of the three partial gradients is then all-reduced once, as DTensor does
// when the three read one Replicate() DTensor and its Partial() gradients meet.
//
// Note [Local modules]
// loom's parameters stay plain tensors, not DTensors: a split layer holds this rank's shard
// as its weight and its configuration says so (a column-parallel Linear(512, 1024) on 2
// ranks prints Linear(in_features=512, out_features=512)). The placement of each split
// tensor is recorded in the StatePlacements that parallelize_module returns, which
// full_state_dict (tp_state_dict.h) reads to write the single-process names and shapes.
// Modules take and return plain tensors, so the hooks always hand on the local tensor:
// PyTorch's use_local_output=True.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "nn/module.h"                   // defines: Module
#include "nn/ordered_dict.h"             // defines: OrderedDict
#include "parallel/comm/communicator.h"  // defines: Communicator
#include "parallel/tensor/placement.h"   // defines: Placement, Shard, Replicate, Partial

namespace loom::distributed {

// How one split tensor of a model is laid out: PyTorch's DTensorSpec on one mesh dimension.
struct DTensorSpec {
  std::shared_ptr<Communicator> group;
  Placement placement;
  Shape shape;  // the global shape
};
// The split tensors of a model's state_dict, by state_dict name; every other tensor is
// Replicate() (every rank holds it whole, alike).
using StatePlacements = OrderedDict<DTensorSpec>;

class ParallelStyle {
 public:
  virtual ~ParallelStyle() = default;
  // Splits `module` (named `name` in the model) over `group`: its parameters and buffers
  // replaced by this rank's shards (recorded under "name.param" in `placements`), and the
  // hooks that move its input and output registered. Every rank of the group calls it.
  virtual void apply(nn::Module& module, const std::string& name, const std::shared_ptr<Communicator>& group,
                     StatePlacements& placements) const = 0;
  // "ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(dim=1))", as PyTorch's repr.
  virtual std::string str() const = 0;
};

// Output features split: weight Shard(0), bias Shard(0). The input arrives as
// input_layouts (default Replicate()) and is made whole on every rank; the output leaves
// as output_layouts (default this rank's features, Note [Feature dims of Linear and Conv2d]).
class ColwiseParallel : public ParallelStyle {
 public:
  struct Options {
    std::optional<Placement> input_layouts = std::nullopt;   // default Replicate()
    std::optional<Placement> output_layouts = std::nullopt;  // default Shard(feature dim)
    // false: leave the input's gradient a partial sum, for a parent that reduces it once
    // for several column-parallel layers reading one input (Note [One f for q, k and v]).
    bool reduce_input_grad = true;
  };
  ColwiseParallel() = default;
  explicit ColwiseParallel(Options options) : options_(options) {}
  void apply(nn::Module& module, const std::string& name, const std::shared_ptr<Communicator>& group,
             StatePlacements& placements) const override;
  std::string str() const override;

 private:
  Options options_;
};

// Input features split: weight Shard(1); the bias stays whole and is added once, after
// the partial sums are reduced (Note [Row-parallel bias]). The input arrives as
// input_layouts (default this rank's features); the output, a Partial() sum, leaves as
// output_layouts (default Replicate(): all-reduced; Shard(d): reduce-scattered).
class RowwiseParallel : public ParallelStyle {
 public:
  struct Options {
    std::optional<Placement> input_layouts = std::nullopt;   // default Shard(feature dim)
    std::optional<Placement> output_layouts = std::nullopt;  // default Replicate()
  };
  RowwiseParallel() = default;
  explicit RowwiseParallel(Options options) : options_(options) {}
  void apply(nn::Module& module, const std::string& name, const std::shared_ptr<Communicator>& group,
             StatePlacements& placements) const override;
  std::string str() const override;

 private:
  Options options_;
};

// A BatchNorm2d after a column-parallel convolution: weight, bias and running statistics
// split along the channels as the input's are (Shard(0) of each per-channel tensor), so
// each rank normalises its own channels. Batch statistics are per channel, so nothing is
// communicated and the result equals the unsplit layer's slice.
class ChannelParallel : public ParallelStyle {
 public:
  void apply(nn::Module& module, const std::string& name, const std::shared_ptr<Communicator>& group,
             StatePlacements& placements) const override;
  std::string str() const override { return "ChannelParallel()"; }
};

// Moves a module's input from input_layouts to desired_input_layouts before its forward.
// reduce_grad: the gradient that comes back to the moved input is a partial sum (column-
// parallel layers inside read it, each with its own columns, and leave it unreduced:
// ColwiseParallel({.reduce_input_grad = false})), all-reduced here once: Megatron's f for
// the whole module. Note [One f for q, k and v].
class PrepareModuleInput : public ParallelStyle {
 public:
  PrepareModuleInput(Placement input_layouts, Placement desired_input_layouts, bool reduce_grad = false)
      : from_(input_layouts), to_(desired_input_layouts), reduce_grad_(reduce_grad) {}
  void apply(nn::Module& module, const std::string& name, const std::shared_ptr<Communicator>& group,
             StatePlacements& placements) const override;
  std::string str() const override;

 private:
  Placement from_, to_;
  bool reduce_grad_ = false;
};

// Moves a module's output from output_layouts to desired_output_layouts after its forward.
class PrepareModuleOutput : public ParallelStyle {
 public:
  PrepareModuleOutput(Placement output_layouts, Placement desired_output_layouts)
      : from_(output_layouts), to_(desired_output_layouts) {}
  void apply(nn::Module& module, const std::string& name, const std::shared_ptr<Communicator>& group,
             StatePlacements& placements) const override;
  std::string str() const override;

 private:
  Placement from_, to_;
};

// `local` (this rank's tensor of a DTensor placed `from`) moved to `to`, as a
// differentiable local tensor: DTensor::from_local(local, group, from, global_shape)
// .redistribute(to).to_local(). Without global_shape, a Shard() tensor is taken to be cut
// evenly, as PyTorch's from_local guesses. With grad_partial, the result's gradient is
// declared Partial() and the backward all-reduces it: Megatron's f. The one move every
// style's hooks make.
Tensor move_local(const Tensor& local, const std::shared_ptr<Communicator>& group, const Placement& from,
                  const Placement& to, bool grad_partial = false, std::optional<Shape> global_shape = std::nullopt);

}  // namespace loom::distributed
