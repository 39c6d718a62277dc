// Sequential: runs its children in order, each on the previous one's output, as
// torch.nn.Sequential. Children are named "0", "1", ... so that state_dict keys match
// PyTorch's ("layer2.0.downsample.1.running_var" is child "1" of a Sequential).
//
//   auto head = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
//       std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(512, 10)});
//   Tensor logits = head->forward(features);
//   auto fc = head->at<nn::Linear>(1);
#pragma once

#include <memory>
#include <vector>

#include "nn/module.h"

namespace loom::nn {

class Sequential : public Module {
 public:
  Sequential() : Module("Sequential") {}
  explicit Sequential(const std::vector<std::shared_ptr<Module>>& modules);

  // Appends a child named by its position.
  void push_back(std::shared_ptr<Module> module);
  size_t size() const { return children_.size(); }
  std::shared_ptr<Module> operator[](size_t index) const;
  // The child at `index` as its concrete type; a loom::Error if it is another type.
  template <typename M>
  std::shared_ptr<M> at(size_t index) const {
    auto typed = std::dynamic_pointer_cast<M>((*this)[index]);
    LOOM_CHECK(typed, "Sequential::at(", index, "): the child is a ", (*this)[index]->type_name(),
               ", not the requested type");
    return typed;
  }

  Tensor forward(const Tensor& input) override;
  // A Sequential is its own list of layers.
  std::shared_ptr<Sequential> sequential() const override;
  // Containers clone each child's structure (their children may be any module type).
  std::shared_ptr<Module> clone_structure() const override;
};

}  // namespace loom::nn
