#include "parallel/tensor/parallel_style.h"

#include "autograd/grad_mode.h"          // defines: NoGradGuard
#include "autograd/ops.h"                // defines: add, reshape (the row-parallel bias)
#include "core/error.h"                  // defines: LOOM_CHECK, LOOM_FAIL
#include "nn/batchnorm.h"                // defines: BatchNorm2d (ChannelParallel)
#include "nn/conv.h"                     // defines: Conv2d
#include "nn/linear.h"                   // defines: Linear
#include "parallel/tensor/dtensor.h"     // defines: DTensor

namespace loom::distributed {

// Note [Row-parallel bias]
// A row-parallel layer's ranks each compute x_r W_r^T, and the output is their sum. Were
// each to add the bias too, the sum would hold it tp times. Megatron adds it once, after
// the all-reduce, to the whole output; so does loom: the layer's forward leaves it out
// (Linear::adds_bias = false) and the hook that reduces the output adds it. The bias is
// Replicate(): every rank holds it whole and, adding it to the same reduced output, gets
// its whole gradient, as the layers after an all-reduce do (Note [Gradient placements]).

namespace {

// A Linear or a Conv2d as the column and row styles see it: the weight [out, in, ...],
// the bias, the feature counts to update, and where the features are in its input and
// output (Note [Feature dims of Linear and Conv2d]).
struct SplitLayer {
  Tensor weight, bias;  // handles of the registered parameters (bias undefined without one)
  int64_t* in_features = nullptr;
  int64_t* out_features = nullptr;
  bool* adds_bias = nullptr;
  int64_t feature_dim = -1;  // -1 for Linear, 1 for Conv2d
};

SplitLayer split_layer(nn::Module& module, const std::string& name, const char* style) {
  if (auto* linear = dynamic_cast<nn::Linear*>(&module))
    return {linear->weight, linear->bias, &linear->in_features, &linear->out_features, &linear->adds_bias, -1};
  if (auto* conv = dynamic_cast<nn::Conv2d*>(&module)) {
    LOOM_CHECK(conv->groups == 1, style, " splits a Conv2d's channels and needs groups=1; '", name,
               "' has groups=", conv->groups);
    return {conv->weight, conv->bias, &conv->in_channels, &conv->out_channels, &conv->adds_bias, 1};
  }
  LOOM_FAIL(style, " applies to a Linear or a Conv2d; the plan names '", name, "', a ", module.type_name());
}

std::string qualified(const std::string& name, const std::string& tensor) {
  return name.empty() ? tensor : name + "." + tensor;
}

// Replaces `tensor`'s data (a registered parameter or buffer: every handle sees it, Note
// [Parameters keep their identity]) by this rank's rows along `dim`, and records the split.
// Every rank must get one row at least: PyTorch allows empty shards (torch.chunk cuts 4
// rows over 3 ranks into 2, 2, 0), but a layer with no channels is not a layer loom's
// kernels run.
void shard_in_place(const Tensor& tensor, int64_t dim, const std::string& name,
                    const std::shared_ptr<Communicator>& group, StatePlacements& placements) {
  if (!tensor.defined()) return;
  const Shape global = tensor.shape();
  const int64_t rows = global[static_cast<size_t>(dim)];
  std::string cut;  // "2, 2, 0": torch.chunk's pieces, one per rank
  bool every_rank_has_rows = true;
  for (int r = 0; r < group->size(); ++r) {
    const int64_t length = shard_range(rows, group->size(), r).length;
    cut += (r ? ", " : "") + std::to_string(length);
    every_rank_has_rows = every_rank_has_rows && length > 0;
  }
  LOOM_CHECK(every_rank_has_rows, "tensor parallelism over ", group->size(), " ranks cannot split '", name, "' (shape ",
             global, ") along dim ", dim, ": its ", rows, " rows there cut as torch.chunk cuts them into ", cut,
             ", and every rank needs one at least; use a tp degree that leaves none empty (", rows, " rows: at most ",
             "ceil(rows / tp) * (tp - 1) < rows)");
  const ShardRange mine = shard_range(rows, group->size(), group->rank());
  NoGradGuard no_grad;
  nn::set_data(tensor, tensor.detach().narrow(dim, mine.offset, mine.length).contiguous().clone());
  placements.insert(name, {group, Shard(dim), global});
}

// The layout a hook sees, with a negative Shard dim resolved against the tensor it moves.
Placement resolved(const Placement& p, const Tensor& t) { return normalized(p, t.dim()); }

// The bias added to a row-parallel layer's reduced output, broadcast over its feature dim.
Tensor add_bias(const Tensor& y, const Tensor& bias, int64_t feature_dim) {
  if (!bias.defined()) return y;
  if (feature_dim == -1) return add(y, bias);
  Shape shape(static_cast<size_t>(y.dim()), 1);
  shape[static_cast<size_t>(feature_dim)] = bias.size(0);
  return add(y, reshape(bias, shape));
}

}  // namespace

Tensor move_local(const Tensor& local, const std::shared_ptr<Communicator>& group, const Placement& from,
                  const Placement& to, bool grad_partial, std::optional<Shape> global_shape) {
  DTensor d = DTensor::from_local(local, group, from, std::move(global_shape));
  if (!(d.placement() == normalized(to, d.dim()))) d = d.redistribute(to);
  return grad_partial ? d.to_local(Partial()) : d.to_local();
}

void ColwiseParallel::apply(nn::Module& module, const std::string& name, const std::shared_ptr<Communicator>& group,
                            StatePlacements& placements) const {
  SplitLayer layer = split_layer(module, name, "ColwiseParallel");
  const Placement in = options_.input_layouts.value_or(Replicate());
  const Placement out = options_.output_layouts.value_or(Shard(layer.feature_dim));
  LOOM_CHECK(!in.is_partial(), "ColwiseParallel on '", name, "': input_layouts must be Replicate() or Shard(d), got ",
             in.str());
  LOOM_CHECK(!out.is_partial(), "ColwiseParallel on '", name, "': output_layouts must be Shard(d) (the features: ",
             "each rank's own) or Replicate() (all-gathered), got ", out.str());
  const int64_t global_out = *layer.out_features;
  shard_in_place(layer.weight, 0, qualified(name, "weight"), group, placements);
  shard_in_place(layer.bias, 0, qualified(name, "bias"), group, placements);
  *layer.out_features = layer.weight.size(0);
  // f: whole on every rank forward; the input's gradient, a partial sum on each rank (each
  // multiplied its own columns), all-reduced backward.
  const bool reduce_grad = options_.reduce_input_grad;
  module.register_forward_pre_hook([group, in, reduce_grad](nn::Module&, const Tensor& x) {
    return move_local(x, group, in, Replicate(), /*grad_partial=*/reduce_grad);
  });
  const int64_t feature_dim = layer.feature_dim;
  module.register_forward_hook([group, out, feature_dim, global_out](nn::Module&, const Tensor&, const Tensor& y) {
    const Placement mine = resolved(Shard(feature_dim), y);
    if (resolved(out, y) == mine) return y;
    Shape global = y.shape();
    global[static_cast<size_t>(mine.dim)] = global_out;
    return move_local(y, group, mine, out, false, global);
  });
}

std::string ColwiseParallel::str() const {
  return "ColwiseParallel(input_layouts=" + options_.input_layouts.value_or(Replicate()).str() + ", output_layouts=" +
         (options_.output_layouts ? options_.output_layouts->str() : std::string("Shard(features)")) + ")";
}

void RowwiseParallel::apply(nn::Module& module, const std::string& name, const std::shared_ptr<Communicator>& group,
                            StatePlacements& placements) const {
  SplitLayer layer = split_layer(module, name, "RowwiseParallel");
  const Placement in = options_.input_layouts.value_or(Shard(layer.feature_dim));
  const Placement out = options_.output_layouts.value_or(Replicate());
  LOOM_CHECK(in.is_replicate() || (in.is_shard() && in.dim == layer.feature_dim), "RowwiseParallel on '", name,
             "': input_layouts must be Shard(", layer.feature_dim, ") (each rank's features, as a column-parallel "
             "layer leaves them) or Replicate() (cut here), got ", in.str());
  LOOM_CHECK(!out.is_partial(), "RowwiseParallel on '", name, "': output_layouts must be Replicate() (all-reduced) ",
             "or Shard(d) (reduce-scattered), got ", out.str(), "; the partial sums are reduced inside the style");
  const int64_t global_in = *layer.in_features;
  shard_in_place(layer.weight, 1, qualified(name, "weight"), group, placements);
  *layer.in_features = layer.weight.size(1);
  *layer.adds_bias = false;  // Note [Row-parallel bias]
  const int64_t feature_dim = layer.feature_dim;
  module.register_forward_pre_hook([group, in, feature_dim, global_in](nn::Module&, const Tensor& x) {
    if (resolved(in, x) == resolved(Shard(feature_dim), x)) return x;  // already this rank's features
    LOOM_CHECK(x.size(feature_dim) == global_in, "RowwiseParallel: a Replicate() input needs all ", global_in,
               " features along dim ", feature_dim, ", got shape ", x.shape());
    return move_local(x, group, Replicate(), Shard(feature_dim));
  });
  module.register_forward_hook([group, out, feature_dim](nn::Module& m, const Tensor&, const Tensor& partial) {
    const Placement to = resolved(out, partial);
    const Tensor bias = split_layer(m, "", "RowwiseParallel").bias;  // the module's own, clones' too
    LOOM_CHECK(!(to.is_shard() && to.dim == resolved(Shard(feature_dim), partial).dim && bias.defined()),
               "RowwiseParallel: output_layouts ", to.str(), " cuts the features, and the whole bias cannot be added "
               "to a slice of them; use Replicate() or shard another dim");
    return add_bias(move_local(partial, group, Partial(), to), bias, feature_dim);  // g, then the bias once
  });
}

std::string RowwiseParallel::str() const {
  return "RowwiseParallel(input_layouts=" +
         (options_.input_layouts ? options_.input_layouts->str() : std::string("Shard(features)")) +
         ", output_layouts=" + options_.output_layouts.value_or(Replicate()).str() + ")";
}

void ChannelParallel::apply(nn::Module& module, const std::string& name, const std::shared_ptr<Communicator>& group,
                            StatePlacements& placements) const {
  auto* bn = dynamic_cast<nn::BatchNorm2d*>(&module);
  LOOM_CHECK(bn != nullptr, "ChannelParallel applies to a BatchNorm2d (after a column-parallel Conv2d); the plan "
             "names '", name, "', a ", module.type_name());
  for (const auto& [tensor_name, tensor] : bn->named_parameters(false))
    shard_in_place(tensor, 0, qualified(name, tensor_name), group, placements);
  if (bn->running_mean.defined()) shard_in_place(bn->running_mean, 0, qualified(name, "running_mean"), group, placements);
  if (bn->running_var.defined()) shard_in_place(bn->running_var, 0, qualified(name, "running_var"), group, placements);
  bn->num_features = shard_range(bn->num_features, group->size(), group->rank()).length;
}

void PrepareModuleInput::apply(nn::Module& module, const std::string&, const std::shared_ptr<Communicator>& group,
                               StatePlacements&) const {
  const Placement from = from_, to = to_;
  const bool reduce_grad = reduce_grad_;
  LOOM_CHECK(!reduce_grad || to.is_replicate(), "PrepareModuleInput: reduce_grad all-reduces the gradient of a "
             "Replicate() input; desired_input_layouts is ", to.str());
  module.register_forward_pre_hook([group, from, to, reduce_grad](nn::Module&, const Tensor& x) {
    return move_local(x, group, from, to, reduce_grad);
  });
}

std::string PrepareModuleInput::str() const {
  return "PrepareModuleInput(input_layouts=" + from_.str() + ", desired_input_layouts=" + to_.str() +
         (reduce_grad_ ? ", reduce_grad=True)" : ")");
}

void PrepareModuleOutput::apply(nn::Module& module, const std::string&, const std::shared_ptr<Communicator>& group,
                                StatePlacements&) const {
  const Placement from = from_, to = to_;
  module.register_forward_hook(
      [group, from, to](nn::Module&, const Tensor&, const Tensor& y) { return move_local(y, group, from, to); });
}

std::string PrepareModuleOutput::str() const {
  return "PrepareModuleOutput(output_layouts=" + from_.str() + ", desired_output_layouts=" + to_.str() + ")";
}

}  // namespace loom::distributed
