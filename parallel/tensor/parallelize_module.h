// parallelize_module: tensor parallelism applied to a plain model by a plan that names its
// layers, as torch.distributed.tensor.parallel.parallelize_module.
//
//   auto tp = mesh.group("tp");                              // or any Communicator
//   StatePlacements placements = parallelize_module(model, tp, {
//       {"layer*.*.conv1", ColwiseParallel()},               // '*' matches one name
//       {"layer*.*.bn1", ChannelParallel()},
//       {"layer*.*.conv2", RowwiseParallel()},
//   });
//   optim::SGD opt(model->parameters(), ...);                // this rank's shards and the rest
//   auto state = full_state_dict(*model, placements);        // tp_state_dict.h: single-process names
//
// Each plan entry's style (parallel_style.h) splits the modules whose dotted name matches
// it: a pattern of names and '*' (one whole name: "layer*" matches layer1..layer4, "*"
// any one level), as PyTorch's fnmatch over module names. A pattern that matches no module
// is an error naming the model's modules, not a layer silently left whole.
//
// Note [One model on every tp rank]
// Each rank keeps its own rows of a weight every rank holds whole, so the ranks must hold
// the same whole weights first; and the layers the plan leaves whole (the stem, the head,
// the shortcuts) are computed alike by every rank only if they are the same. Rather than
// trust every rank's initialisation, parallelize_module broadcasts the whole model's
// parameters and buffers from the group's rank 0 before it splits anything: PyTorch's
// src_data_rank=0.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nn/module.h"                       // defines: Module
#include "parallel/comm/communicator.h"      // defines: Communicator
#include "parallel/tensor/parallel_style.h"  // defines: ParallelStyle, StatePlacements, the styles

namespace loom::distributed {

// One entry of a plan: a module name pattern and the style its modules get.
struct PlanEntry {
  template <typename Style>
  PlanEntry(std::string pattern_, Style style_)
      : pattern(std::move(pattern_)), style(std::make_shared<Style>(std::move(style_))) {}
  PlanEntry(std::string pattern_, std::shared_ptr<const ParallelStyle> style_)
      : pattern(std::move(pattern_)), style(std::move(style_)) {}

  std::string pattern;
  std::shared_ptr<const ParallelStyle> style;
};
using ParallelizePlan = std::vector<PlanEntry>;

// Applies `plan` to `module`'s submodules over `group` (in a composed run, the mesh's "tp"
// dimension); every rank of the group calls it with the same plan. Returns the placement of
// every tensor it split, by state_dict name. An empty plan, a pattern that matches nothing,
// two entries matching one module, or a style that does not fit its module: an error.
StatePlacements parallelize_module(nn::Module& module, const std::shared_ptr<Communicator>& group,
                                   const ParallelizePlan& plan);
// The whole module in one style (PyTorch's parallelize_module(linear, mesh, ColwiseParallel())).
StatePlacements parallelize_module(nn::Module& module, const std::shared_ptr<Communicator>& group,
                                   const ParallelStyle& style);

// Whether dotted `name` matches `pattern` (names separated by '.', '*' within a name
// matching any run of characters but '.').
bool matches_module_pattern(const std::string& pattern, const std::string& name);

}  // namespace loom::distributed
