#include "autograd/saved_tensor.h"

#include "core/error.h"

namespace loom {

SavedTensor::SavedTensor(const Tensor& tensor, const char* saved_by) : saved_by_(saved_by) {
  if (!tensor.defined()) return;
  tensor_ = tensor.detach();  // See Note [Saved tensors]
  version_ = tensor.version();
}

const Tensor& SavedTensor::get() const {
  if (tensor_.defined()) {
    LOOM_CHECK(tensor_.version() == version_,
               "one of the tensors needed for gradient computation has been modified by an in-place "
               "operation: ", tensor_.str(), " saved by ", saved_by_, " was at version ", version_,
               " and is now at version ", tensor_.version(),
               ". Hint: replace the in-place op (add_, mul_, fill_, copy_, ...) on it, or on a view "
               "of it, by its out-of-place form");
  }
  return tensor_;
}

}  // namespace loom
