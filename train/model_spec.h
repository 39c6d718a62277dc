// ModelSpec: everything the training layer needs to know about a model family, in one
// place, as torchtitan's ModelSpec / TrainSpec: how to build it by name, which of its
// modules are the blocks FSDP shards and activation checkpointing recomputes, how tensor
// parallelism splits it, and which parameters AdamW leaves undecayed. Pipelines cut, and
// FSDP wraps, the layers the model itself lists (Module::sequential()).
//
//   const ModelSpec& spec = model_spec("vit_tiny");   // an unknown name lists every one
//   auto model = spec.build("vit_tiny", 10);
//   fsdp::FSDPOptions options{.auto_wrap_policy = spec.block_policy()};
//   if (spec.tp_plan) parallelize_module(*model, tp, spec.tp_plan(*model, tp->size()));
//
// Note [Adding a model to the trainer]
// A model family is one spec file (train/models/resnet.cpp is the pattern) and one line in
// builtin_model_specs() (train/model_spec.cpp); a program may instead call
// register_model_spec at startup (tests/test_model_spec_launch.cpp trains a toy model that
// way under DDP, FSDP, TP and a pipeline of processes). Nothing else in train/ names a
// model type: parallelize, the optimizer and the checkpoints ask the spec.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "nn/module.h"                        // defines: Module
#include "parallel/fsdp/wrap_policy.h"        // defines: ModuleWrapPolicy
#include "parallel/tensor/parallelize_module.h"  // defines: ParallelizePlan

namespace loom::training {

struct ModelSpec {
  std::string family;              // "resnet", "vit", "airbench": for --help and messages
  std::vector<std::string> names;  // the --model values it builds, in --help's order
  // The model `name` (one of names) with num_classes outputs, freshly initialised.
  std::function<std::shared_ptr<nn::Module>(const std::string& name, int64_t num_classes)> build;
  // Module::type_name()s of its blocks: each is an FSDP unit (the runs of other layers
  // between them too) and what --activation-checkpoint recomputes.
  std::set<std::string> block_types;
  // --tp's plan for a model this spec built, over `tp` ranks; null: --tp is refused.
  std::function<distributed::ParallelizePlan(const nn::Module& model, int tp)> tp_plan;
  // Parameters AdamW exempts from weight decay besides biases and norms (timm's
  // model.no_weight_decay()); null: none.
  std::function<std::set<std::string>(const nn::Module& model)> no_weight_decay;

  fsdp::ModuleWrapPolicy block_policy() const { return {block_types}; }
};

// The spec that builds --model `name`: a loom::Error listing every registered name.
const ModelSpec& model_spec(const std::string& name);
// Every --model name, family by family, as --help lists them.
std::vector<std::string> model_names();
// Adds a family (a program's own model); its names must be new.
void register_model_spec(ModelSpec spec);

// The families train/models/ defines, one per file.
ModelSpec resnet_spec();
ModelSpec vit_spec();
ModelSpec airbench_spec();

// A spec's typed hook: f receives the model as the type the spec's build() makes, which
// is the only kind of model a spec is asked about (model_spec(name).build(name, ...)).
template <class M, class F>
auto for_model(F f) {
  return [f](const nn::Module& model, auto&&... rest) { return f(static_cast<const M&>(model), rest...); };
}

}  // namespace loom::training
