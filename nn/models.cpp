#include "nn/models.h"

#include <functional>
#include <utility>

#include "core/error.h"              // defines: LOOM_CHECK
#include "nn/vision_transformer.h"  // defines: vit_tiny, vit_small, VisionTransformer::sequential

namespace loom::nn {

namespace {

using Builder = std::function<std::shared_ptr<Module>(const ModelArgs&)>;

const std::vector<std::pair<std::string, Builder>>& registry() {
  static const std::vector<std::pair<std::string, Builder>> models = {
      {"resnet18", [](const ModelArgs& a) { return resnet18(a.num_classes, a.stem); }},
      {"resnet34", [](const ModelArgs& a) { return resnet34(a.num_classes, a.stem); }},
      {"resnet50", [](const ModelArgs& a) { return resnet50(a.num_classes, a.stem); }},
      {"resnet101", [](const ModelArgs& a) { return resnet101(a.num_classes, a.stem); }},
      {"resnet152", [](const ModelArgs& a) { return resnet152(a.num_classes, a.stem); }},
      {"wide_resnet50_2", [](const ModelArgs& a) { return wide_resnet50_2(a.num_classes, a.stem); }},
      {"wide_resnet101_2", [](const ModelArgs& a) { return wide_resnet101_2(a.num_classes, a.stem); }},
      // The narrow one-block-per-stage ResNet that tests and demos train in seconds; "tiny"
      // is the short name the trainer's tests use.
      {"resnet_tiny", [](const ModelArgs& a) { return resnet_tiny(a.num_classes); }},
      {"tiny", [](const ModelArgs& a) { return resnet_tiny(a.num_classes); }},
      // Vision Transformers on 4x4 patches of 32x32 images (nn/vision_transformer.h).
      {"vit_tiny", [](const ModelArgs& a) { return vit_tiny(a.num_classes); }},
      {"vit_small", [](const ModelArgs& a) { return vit_small(a.num_classes); }},
  };
  return models;
}

}  // namespace

std::vector<std::string> model_names() {
  std::vector<std::string> names;
  for (const auto& entry : registry()) names.push_back(entry.first);
  return names;
}

std::shared_ptr<Module> make_model(const std::string& name, const ModelArgs& args) {
  LOOM_CHECK(args.num_classes > 0, "make_model(\"", name, "\"): num_classes must be positive, got ", args.num_classes);
  for (const auto& entry : registry())
    if (entry.first == name) return entry.second(args);
  std::string known;
  for (const auto& entry : registry()) known += (known.empty() ? "" : ", ") + entry.first;
  LOOM_FAIL("unknown model '", name, "': expected one of ", known);
}

std::shared_ptr<Sequential> sequential_view(const Module& model) {
  if (std::shared_ptr<Sequential> layers = model.sequential()) return layers;
  LOOM_FAIL("a ", model.type_name(), " has no sequential() view of its layers, which pipelines cut and FSDP wraps; "
            "give it one as ResNet and VisionTransformer do (docs/models.md)");
}

}  // namespace loom::nn
