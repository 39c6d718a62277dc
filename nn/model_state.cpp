#include "nn/model_state.h"

#include <set>
#include <vector>

namespace loom::nn {
namespace {

int64_t storage_bytes(const std::vector<Tensor>& tensors) {
  std::set<const StorageImpl*> seen;
  int64_t bytes = 0;
  for (const Tensor& t : tensors) {
    if (!t.defined() || !t.storage()) continue;
    if (seen.insert(t.storage().get()).second) bytes += static_cast<int64_t>(t.storage()->nbytes());
  }
  return bytes;
}

std::vector<Tensor> parameters_and_grads(const Module& module) {
  std::vector<Tensor> out;
  for (const Tensor& p : module.parameters()) {
    out.push_back(p);
    out.push_back(p.grad());
  }
  return out;
}

}  // namespace

int64_t model_state_bytes(const Module& module, const optim::Optimizer& optimizer) {
  std::vector<Tensor> all = parameters_and_grads(module);
  for (const Tensor& t : optimizer.state_tensors()) all.push_back(t);
  return storage_bytes(all);
}

int64_t model_state_bytes(const Module& module) { return storage_bytes(parameters_and_grads(module)); }

}  // namespace loom::nn
