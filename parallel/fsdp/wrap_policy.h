// Which modules become FSDP units: an auto-wrap policy by module type, as PyTorch's
// ModuleWrapPolicy({BasicBlock, Bottleneck, TransformerEncoderLayer}), and the pure function that cuts a model's
// stages into units by it.
//
// loom runs an FSDP model as a sequence of stages (an nn::Sequential, or a model that
// offers one: ResNet::sequential(), VisionTransformer::sequential()): FSDP drives the
// forward itself, stage by stage, and so knows exactly when each unit starts and ends
// (Note [Why FSDP runs the stages itself], fully_sharded_data_parallel.h).
//
//   ResNet stages:  conv1 bn1 relu | block block ... block | avgpool flatten fc
//   units:          ----stem----     one unit per block     ------head------
//
// A stage whose type is in the policy is a unit of its own; each run of other stages
// between them is one unit (the stem before the first block, the head after the last),
// so every parameter belongs to exactly one unit.
#pragma once

#include <cstddef>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "nn/container.h"  // defines: Sequential

namespace loom::fsdp {

struct ModuleWrapPolicy {
  // Module::type_name()s that become units: a ResNet's residual blocks (nn/resnet_blocks.h).
  std::set<std::string> module_types = {"BasicBlock", "Bottleneck", "TransformerEncoderLayer"};
};

// A unit: stages [begin, end) of the sequence, and a name for traces and messages.
struct UnitPlan {
  size_t begin = 0, end = 0;
  std::string name;
  bool operator==(const UnitPlan&) const = default;
};

// Pure: stage_types[i] is stage i's type name.
std::vector<UnitPlan> plan_units(const std::vector<std::string>& stage_types, const ModuleWrapPolicy& policy);

// The stages FSDP runs for `module`: the module itself if it is a Sequential, its
// sequential() if it is a ResNet; otherwise a loom::Error saying what FSDP needs.
std::shared_ptr<nn::Sequential> stages_of(const std::shared_ptr<nn::Module>& module);

}  // namespace loom::fsdp
