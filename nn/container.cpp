#include "nn/container.h"

#include <string>

namespace loom::nn {

Sequential::Sequential(const std::vector<std::shared_ptr<Module>>& modules) : Sequential() {
  for (const auto& module : modules) push_back(module);
}

void Sequential::push_back(std::shared_ptr<Module> module) {
  register_module(std::to_string(children_.size()), std::move(module));
}

std::shared_ptr<Module> Sequential::operator[](size_t index) const {
  LOOM_CHECK(index < children_.size(), "Sequential: index ", index, " is out of range for a Sequential of ",
             children_.size(), " modules");
  return children_.items()[index].second;
}

Tensor Sequential::forward(const Tensor& input) {
  Tensor x = input;
  for (const auto& [name, child] : children_) x = (*child)(x);
  return x;
}

std::shared_ptr<Sequential> Sequential::sequential() const {
  return std::static_pointer_cast<Sequential>(const_cast<Sequential*>(this)->shared_from_this());
}

std::shared_ptr<Module> Sequential::clone_structure() const {
  auto copy = std::make_shared<Sequential>();
  for (const auto& [name, child] : children_) copy->register_module(name, child->clone_structure());
  return copy;
}

}  // namespace loom::nn
