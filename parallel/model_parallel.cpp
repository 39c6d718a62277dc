#include "parallel/model_parallel.h"

#include "core/error.h"

namespace loom::parallel {

std::vector<std::shared_ptr<nn::Sequential>> split_module(const nn::Sequential& module,
                                                          const std::vector<int64_t>& balance) {
  int64_t total = 0;
  for (int64_t b : balance) {
    LOOM_CHECK(b >= 1, "split_module: every stage needs at least one layer, got balance with ", b);
    total += b;
  }
  LOOM_CHECK(total == static_cast<int64_t>(module.size()), "split_module: the balance covers ", total,
             " layers, but the Sequential has ", module.size(), "; the counts must add up to its length");
  std::vector<std::shared_ptr<nn::Sequential>> stages;
  size_t next = 0;
  for (int64_t b : balance) {
    auto stage = std::make_shared<nn::Sequential>();
    for (int64_t k = 0; k < b; ++k) stage->push_back(module[next++]);
    stages.push_back(std::move(stage));
  }
  return stages;
}

ModelParallel::ModelParallel(std::shared_ptr<nn::Sequential> module, std::vector<Device> devices,
                             std::vector<int64_t> balance)
    : ModelParallel("ModelParallel", std::move(module), std::move(devices), std::move(balance)) {}

ModelParallel::ModelParallel(std::string name, std::shared_ptr<nn::Sequential> module, std::vector<Device> devices,
                             std::vector<int64_t> balance)
    : nn::Module(std::move(name)),
      module_(std::move(module)),
      devices_(std::move(devices)),
      balance_(std::move(balance)) {
  LOOM_CHECK(module_ != nullptr, type_name(), ": the module is null");
  LOOM_CHECK(!devices_.empty(), type_name(), ": no devices given");
  LOOM_CHECK(balance_.size() == devices_.size(), type_name(), ": ", balance_.size(), " stages in the balance but ",
             devices_.size(), " devices; give one device per stage");
  register_module("module", module_);
  stages_ = split_module(*module_, balance_);
  for (size_t k = 0; k < stages_.size(); ++k) stages_[k]->to(devices_[k]);
}

Tensor ModelParallel::forward(const Tensor& input) {
  Tensor x = input;
  for (size_t k = 0; k < stages_.size(); ++k) x = (*stages_[k])(x.to(devices_[k]));
  return x;
}

std::string ModelParallel::extra_repr() const {
  std::string out = "stages=[";
  for (size_t k = 0; k < stages_.size(); ++k)
    out += (k ? ", " : "") + std::to_string(balance_[k]) + " layers on " + devices_[k].str();
  return out + "]";
}

}  // namespace loom::parallel
