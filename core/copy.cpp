#include "core/copy.h"

#include "core/error.h"
#include "core/kernels.h"

namespace loom {

void copy_into(Tensor& dst, const Tensor& src, bool non_blocking) {
  LOOM_CHECK(dst.shape() == src.shape(), "copy: destination shape ", dst.shape(), " does not match source shape ",
             src.shape());
  if (dst.numel() == 0) return;
  Device backend = src.device().is_cuda() ? src.device() : dst.device();
  copy_kernel(backend)(src, dst, non_blocking);
}

}  // namespace loom
