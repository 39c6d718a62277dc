// The dispatch stubs declared in core/kernels.h; backends fill them at load time.
#include "core/kernels.h"

namespace loom {

LOOM_DEFINE_KERNEL(unary_kernel);
LOOM_DEFINE_KERNEL(binary_kernel);
LOOM_DEFINE_KERNEL(pow_scalar_kernel);
LOOM_DEFINE_KERNEL(clamp_kernel);
LOOM_DEFINE_KERNEL(where_kernel);
LOOM_DEFINE_KERNEL(threshold_backward_kernel);
LOOM_DEFINE_KERNEL(fill_kernel);
LOOM_DEFINE_KERNEL(copy_kernel);
// They move bytes and compute nothing: shape-only runs keep them (Note [Shape-only runs]).
[[maybe_unused]] static const bool byte_movers = fill_kernel.moves_bytes_only = copy_kernel.moves_bytes_only = true;
LOOM_DEFINE_KERNEL(uniform_kernel);
LOOM_DEFINE_KERNEL(normal_kernel);
LOOM_DEFINE_KERNEL(randint_kernel);
LOOM_DEFINE_KERNEL(reduce_kernel);
LOOM_DEFINE_KERNEL(max_min_dim_kernel);
LOOM_DEFINE_KERNEL(non_finite_check_and_unscale_kernel);
LOOM_DEFINE_KERNEL(mm_kernel);
LOOM_DEFINE_KERNEL(bmm_kernel);
LOOM_DEFINE_KERNEL(index_select_kernel);
LOOM_DEFINE_KERNEL(index_add_kernel);
LOOM_DEFINE_KERNEL(gather_kernel);
LOOM_DEFINE_KERNEL(scatter_add_kernel);
LOOM_DEFINE_KERNEL(conv2d_forward_kernel);
LOOM_DEFINE_KERNEL(conv2d_backward_kernel);
LOOM_DEFINE_KERNEL(max_pool2d_forward_kernel);
LOOM_DEFINE_KERNEL(max_pool2d_backward_kernel);
LOOM_DEFINE_KERNEL(avg_pool2d_forward_kernel);
LOOM_DEFINE_KERNEL(avg_pool2d_backward_kernel);
LOOM_DEFINE_KERNEL(adaptive_avg_pool2d_forward_kernel);
LOOM_DEFINE_KERNEL(adaptive_avg_pool2d_backward_kernel);
LOOM_DEFINE_KERNEL(batch_norm_forward_kernel);
LOOM_DEFINE_KERNEL(batch_norm_backward_kernel);
LOOM_DEFINE_KERNEL(log_softmax_forward_kernel);
LOOM_DEFINE_KERNEL(log_softmax_backward_kernel);
LOOM_DEFINE_KERNEL(nll_loss_forward_kernel);
LOOM_DEFINE_KERNEL(nll_loss_backward_kernel);
LOOM_DEFINE_KERNEL(dropout_kernel);

}  // namespace loom
