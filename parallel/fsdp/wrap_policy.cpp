#include "parallel/fsdp/wrap_policy.h"

#include "core/error.h"

namespace loom::fsdp {

std::vector<UnitPlan> plan_units(const std::vector<std::string>& stage_types, const ModuleWrapPolicy& policy) {
  std::vector<UnitPlan> units;
  size_t run_begin = 0;
  bool seen_wrapped = false;
  auto close_run = [&](size_t end) {
    if (end == run_begin) return;
    const bool last = end == stage_types.size();
    std::string name = !seen_wrapped ? "stem" : last ? "head" : "stages " + std::to_string(run_begin);
    if (!seen_wrapped && last) name = "root";  // nothing matched the policy: one unit
    units.push_back({run_begin, end, name});
  };
  for (size_t i = 0; i < stage_types.size(); ++i) {
    if (!policy.module_types.count(stage_types[i])) continue;
    close_run(i);
    units.push_back({i, i + 1, stage_types[i] + " " + std::to_string(i)});
    seen_wrapped = true;
    run_begin = i + 1;
  }
  close_run(stage_types.size());
  return units;
}

std::shared_ptr<nn::Sequential> stages_of(const std::shared_ptr<nn::Module>& module) {
  LOOM_CHECK(module != nullptr, "FullyShardedDataParallel: the module is null");
  if (std::shared_ptr<nn::Sequential> layers = module->sequential()) return layers;
  LOOM_FAIL("FullyShardedDataParallel: loom runs an FSDP model as a sequence of stages, so the module must be an "
            "nn::Sequential or override Module::sequential() (as ResNet and VisionTransformer do); got a ",
            module->type_name(), ", which does not. Wrap its layers in an nn::Sequential, in forward order");
}

}  // namespace loom::fsdp
