#include "train/model_spec.h"

#include <mutex>

#include "core/error.h"  // defines: LOOM_CHECK, LOOM_FAIL

namespace loom::training {

namespace {

// See Note [Adding a model to the trainer]: one line per family.
std::vector<ModelSpec> builtin_model_specs() { return {resnet_spec(), vit_spec(), airbench_spec()}; }

struct Registry {
  std::mutex mutex;
  std::vector<ModelSpec> specs = builtin_model_specs();
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

const ModelSpec& model_spec(const std::string& name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const ModelSpec& spec : r.specs)
    for (const std::string& known : spec.names)
      if (known == name) return spec;
  std::string known;
  for (const ModelSpec& spec : r.specs)
    for (const std::string& n : spec.names) known += (known.empty() ? "" : ", ") + n;
  LOOM_FAIL("unknown model '", name, "': expected one of ", known);
}

std::vector<std::string> model_names() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> names;
  for (const ModelSpec& spec : r.specs) names.insert(names.end(), spec.names.begin(), spec.names.end());
  return names;
}

void register_model_spec(ModelSpec spec) {
  LOOM_CHECK(!spec.names.empty() && spec.build, "register_model_spec: the ", spec.family,
             " spec needs names and a build function");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);  // checked and added under one lock
  for (const ModelSpec& known : r.specs)
    for (const std::string& name : spec.names)
      for (const std::string& taken : known.names)
        LOOM_CHECK(name != taken, "register_model_spec: --model ", name, " is registered already");
  r.specs.push_back(std::move(spec));
}

}  // namespace loom::training
