// Module::state_dict / load_state_dict: a module's whole state as name -> tensor, and
// back. Keys and order are PyTorch's, so a loom checkpoint and a torchvision one line up
// key for key (see nn/safetensors.h for the file format that carries them).
#include <sstream>

#include "autograd/grad_mode.h"
#include "core/copy.h"
#include "nn/module.h"

namespace loom::nn {

void Module::state_dict_into(const std::string& prefix, OrderedDict<Tensor>& out) const {
  for (const auto& [name, p] : parameters_)
    if (p.defined()) out.insert(prefix + name, p.detach());
  for (const auto& [name, b] : buffers_)
    if (b.defined() && !non_persistent_buffers_.count(name)) out.insert(prefix + name, b.detach());
  for (const auto& [name, child] : children_) child->state_dict_into(prefix + name + ".", out);
}

OrderedDict<Tensor> Module::state_dict() const {
  OrderedDict<Tensor> out;
  state_dict_into("", out);
  return out;
}

namespace {

// "missing keys: a, b; unexpected keys: c" for the keys that are present.
std::string describe_key_problems(const LoadResult& result) {
  std::ostringstream out;
  auto list = [&](const char* what, const std::vector<std::string>& keys) {
    if (keys.empty()) return;
    out << "\n  " << what << " (" << keys.size() << "): ";
    for (size_t i = 0; i < keys.size(); ++i) out << (i ? ", " : "") << '"' << keys[i] << '"';
  };
  list("missing keys", result.missing_keys);
  list("unexpected keys", result.unexpected_keys);
  return out.str();
}

}  // namespace

LoadResult Module::load_state_dict(const OrderedDict<Tensor>& state_dict, bool strict) {
  OrderedDict<Tensor> own = this->state_dict();
  LoadResult result;
  for (const auto& [name, t] : own)
    if (!state_dict.contains(name)) result.missing_keys.push_back(name);
  for (const auto& [name, t] : state_dict)
    if (!own.contains(name)) result.unexpected_keys.push_back(name);

  // Check everything before copying anything, so a failed load leaves the module as it
  // was, and report every problem at once (a wrong num_classes shows up as one line per
  // mismatched tensor rather than one error per attempt).
  std::ostringstream mismatches;
  int mismatch_count = 0;
  for (const auto& [name, target] : own) {
    const Tensor* source = state_dict.find(name);
    if (!source) continue;
    if (!source->defined()) {
      mismatches << "\n  \"" << name << "\": the checkpoint's tensor is undefined";
      ++mismatch_count;
    } else if (source->shape() != target.shape()) {
      mismatches << "\n  size mismatch for \"" << name << "\": copying a tensor with shape " << source->shape()
                 << " from the checkpoint, the shape in the current model is " << target.shape();
      ++mismatch_count;
    } else if (source->dtype() != target.dtype()) {
      mismatches << "\n  dtype mismatch for \"" << name << "\": the checkpoint has " << source->dtype()
                 << ", the current model has " << target.dtype();
      ++mismatch_count;
    }
  }
  const bool key_problems = strict && (!result.missing_keys.empty() || !result.unexpected_keys.empty());
  LOOM_CHECK(mismatch_count == 0 && !key_problems, "Error(s) in loading state_dict for ", type_name(), ":",
             key_problems ? describe_key_problems(result) : "", mismatches.str(),
             mismatch_count ? "\n(for a dtype mismatch, convert the model with module.to(dtype) before loading)"
                            : "",
             key_problems ? "\n(pass strict=false to load the matching keys and get the rest in LoadResult)" : "");

  NoGradGuard no_grad;
  for (auto& [name, target] : own) {
    const Tensor* source = state_dict.find(name);
    if (!source) continue;
    copy_into(target, *source);  // `target` shares storage with the parameter or buffer
    target.bump_version();
  }
  return result;
}

}  // namespace loom::nn
