#include "parallel/data_parallel.h"

#include <algorithm>
#include <exception>

#include "autograd/grad_mode.h"  // defines: GradMode, NoGradGuard
#include "autograd/ops.h"        // defines: chunk, cat
#include "autograd/variable.h"   // defines: AutogradMeta (what a replica parameter takes over)
#include "core/error.h"
#include "core/trace.h"          // defines: trace::Span, set_thread_name (each replica's row)
#include "cuda/device.h"         // defines: cuda::device_count, check_device
#include "parallel/device_threads.h"  // defines: run_on_device_threads, CallerState, DeviceScope

namespace loom::parallel {

std::vector<Tensor> scatter(const Tensor& input, const std::vector<Device>& devices, int64_t dim) {
  LOOM_CHECK(input.defined(), "scatter: the input is undefined");
  LOOM_CHECK(!devices.empty(), "scatter: no devices to scatter over");
  LOOM_CHECK(input.dim() > 0 && input.size(dim) > 0, "scatter: cannot split ", input.str(), " along dim ", dim,
             ": it needs at least one element there");
  std::vector<Tensor> chunks = chunk(input, static_cast<int64_t>(devices.size()), dim);
  for (size_t i = 0; i < chunks.size(); ++i) chunks[i] = chunks[i].to(devices[i]);
  return chunks;
}

// Makes the tensor behind `slot` (every handle to it) be `value`: its data and its
// autograd record. See Note [Replica parameters are functions of the parameters].
static void become(const Tensor& slot, const Tensor& value) {
  nn::set_data(slot, value);
  slot.unsafe_impl()->autograd = value.unsafe_impl()->autograd;  // null when no graph was recorded (no_grad)
}

std::vector<std::shared_ptr<nn::Module>> replicate(const nn::Module& module, const std::vector<Device>& devices) {
  const auto params = module.named_parameters();
  const auto buffers = module.named_buffers();
  std::vector<std::shared_ptr<nn::Module>> replicas;
  for (const Device& device : devices) {
    std::shared_ptr<nn::Module> replica = module.clone_structure();  // same layers, flags; empty tensors
    const auto replica_params = replica->named_parameters();
    const auto replica_buffers = replica->named_buffers();
    LOOM_CHECK(replica_params.keys() == params.keys() && replica_buffers.keys() == buffers.keys(),
               "replicate: ", module.type_name(), "'s clone_structure() registers different tensors than the module "
               "has (see Note [Cloneable] in nn/module.h)");
    for (const auto& [name, p] : params) become(*replica_params.find(name), p.to(device));
    NoGradGuard no_grad;
    for (const auto& [name, b] : buffers) {
      Tensor copy = b.to(device);
      become(*replica_buffers.find(name), copy.storage() == b.storage() ? copy.clone() : copy);
    }
    replicas.push_back(std::move(replica));
  }
  return replicas;
}

std::vector<Tensor> parallel_apply(const std::vector<std::shared_ptr<nn::Module>>& modules,
                                   const std::vector<Tensor>& inputs) {
  LOOM_CHECK(modules.size() == inputs.size(), "parallel_apply: got ", modules.size(), " modules but ", inputs.size(),
             " inputs; each module needs one input");
  const size_t n = modules.size();
  for (size_t i = 0; i < n; ++i) LOOM_CHECK(modules[i] != nullptr, "parallel_apply: module ", i, " is null");
  std::vector<Tensor> outputs(n);
  std::vector<std::exception_ptr> errors(n);
  const CallerState caller = CallerState::capture(n);  // Note [What a device thread inherits]
  run_on_device_threads(n, [&](size_t i) {  // replica 0 on this thread: Note [Device threads persist]
    try {
      DeviceScope scope(caller, inputs[i].device());
      if (i > 0 && trace::enabled()) trace::set_thread_name(detail::str("replica ", i));  // 0: the caller's thread
      trace::Span span("forward", "dp");  // each replica's share of the forward, on its device's row
      outputs[i] = (*modules[i])(inputs[i]);
    } catch (...) {
      errors[i] = std::current_exception();
    }
  });
  rethrow_first_error(errors, [&](size_t i) {
    return detail::str("DataParallel: replica ", i, " (input on ", inputs[i].device(), ") failed");
  });
  return outputs;
}

Tensor gather(const std::vector<Tensor>& outputs, Device device, int64_t dim) {
  LOOM_CHECK(!outputs.empty(), "gather: no outputs to gather");
  std::vector<Tensor> moved;
  for (const Tensor& out : outputs) {
    LOOM_CHECK(out.defined(), "gather: an output is undefined");
    moved.push_back(out.to(device));
  }
  return moved.size() == 1 ? moved[0] : cat(moved, dim);
}

static std::vector<Device> default_devices() {
  std::vector<Device> all;
  for (int i = 0; i < cuda::device_count(); ++i) all.emplace_back(DeviceType::CUDA, i);
  return all;
}

DataParallel::DataParallel(std::shared_ptr<nn::Module> module, std::vector<Device> device_ids,
                           std::optional<Device> output_device, int64_t dim)
    : nn::Module("DataParallel"), module_(std::move(module)), device_ids_(std::move(device_ids)), dim_(dim) {
  LOOM_CHECK(module_ != nullptr, "DataParallel: the module is null");
  register_module("module", module_);  // state_dict keys "module.<name>", as PyTorch
  if (device_ids_.empty()) device_ids_ = default_devices();
  for (size_t i = 0; i < device_ids_.size(); ++i) {
    const Device& d = device_ids_[i];
    LOOM_CHECK(d.type == device_ids_[0].type, "DataParallel: device_ids must all be of one type, got ", d, " and ",
               device_ids_[0]);
    LOOM_CHECK(std::find(device_ids_.begin(), device_ids_.begin() + static_cast<long>(i), d) ==
                   device_ids_.begin() + static_cast<long>(i),
               "DataParallel: device ", d, " is listed twice in device_ids; each device runs one replica");
    if (d.is_cuda()) cuda::check_device(d);
  }
  output_device_ = output_device.value_or(device_ids_.empty() ? Device() : device_ids_[0]);
  check_module_device();
}

void DataParallel::check_module_device() const {
  if (device_ids_.empty()) return;
  auto check = [&](const OrderedDict<Tensor>& tensors, const char* kind) {
    for (const auto& [name, t] : tensors)
      LOOM_CHECK(t.device() == device_ids_[0], "DataParallel: the module must have its parameters and buffers on ",
                 device_ids_[0], " (device_ids[0]), but ", kind, " \"", name, "\" is on ", t.device(),
                 ". Move the module first: module->to(", device_ids_[0], ")");
  };
  check(module_->named_parameters(), "parameter");
  check(module_->named_buffers(), "buffer");
}

// See Note [The replica on the first device is the module].
Tensor DataParallel::forward(const Tensor& input) {
  if (device_ids_.empty()) return (*module_)(input);
  check_module_device();  // the module may have been moved since construction
  std::vector<Tensor> inputs = scatter(input, device_ids_, dim_);
  std::vector<Device> others(device_ids_.begin() + 1, device_ids_.begin() + static_cast<long>(inputs.size()));
  std::vector<std::shared_ptr<nn::Module>> replicas = {module_};
  for (auto& replica : replicate(*module_, others)) replicas.push_back(std::move(replica));
  return gather(parallel_apply(replicas, inputs), output_device_, dim_);
}

std::string DataParallel::extra_repr() const {
  std::string devices;
  for (const Device& d : device_ids_) devices += (devices.empty() ? "" : ", ") + d.str();
  return "device_ids=[" + devices + "], output_device=" + output_device_.str() + ", dim=" + std::to_string(dim_);
}

}  // namespace loom::parallel
