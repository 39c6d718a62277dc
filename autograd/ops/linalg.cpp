// Matrix products: mm, bmm, matmul (torch.matmul's rules) and linear, with gradients.
//
// mm and bmm are the two primitives that call a kernel and record a backward; matmul
// and linear are built from them (and from views), so their gradients follow from the
// primitives' — except linear's 2-D fast path, which fuses the bias into the gemm.
//
// Note [Transposed operands are free]
// The kernels read a matrix with a unit stride in either dim without copying (Note [BLAS
// operand layout], core/cpu/linalg.cpp). The gradients below are products with
// transposed views — dA = dC @ B^T, dB = A^T @ dC — so backward never copies an operand;
// only a forward operand with no unit stride (a strided slice, an expanded view) is made
// contiguous first, by gemm_operand.
#include <algorithm>

#include "autograd/autocast.h"  // defines: autocast::apply (Note [Autocast at op entry])
#include "autograd/ops.h"
#include "autograd/ops/common.h"
#include "core/flop_counter.h"     // defines: FlopCounterMode (counted for balance_by_cost_model)
#include "core/copy.h"

namespace loom {
namespace {

using Grads = std::vector<Tensor>;

// True when rows x cols with these strides is a row-major or a transposed row-major
// matrix: the two layouts every backend's mm_kernel / bmm_kernel accepts.
bool blas_readable(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride) {
  if ((cols <= 1 || col_stride == 1) && (rows <= 1 || row_stride >= std::max<int64_t>(cols, 1))) return true;
  return (rows <= 1 || row_stride == 1) && (cols <= 1 || col_stride >= std::max<int64_t>(rows, 1));
}

// The operand as the kernels accept it, detached (the caller records the gradient):
// itself when the matrices in its last two dims are readable in place, else a copy.
Tensor gemm_operand(const Tensor& t) {
  const int64_t r = t.dim() - 2, c = t.dim() - 1;
  Tensor plain = t.detach();
  return blas_readable(t.size(r), t.size(c), t.stride(r), t.stride(c)) ? plain : contiguous(plain);
}

std::string matrix_str(const Tensor& t) {
  return std::to_string(t.size(0)) + "x" + std::to_string(t.size(1));
}

void check_operands(const char* op, const Tensor& a, const Tensor& b) {
  ops::check_same_device_dtype(op, a, b);
  LOOM_CHECK(is_floating(a.dtype()), op, ": expected floating-point tensors, got ", a.dtype(),
             "; integer matrix products are not supported, convert with .to(kFloat32)");
}

}  // namespace

Tensor mm(const Tensor& a, const Tensor& b) {
  if (autocast::any_enabled()) {  // See Note [Autocast at op entry]
    Tensor ca = a, cb = b;
    if (autocast::apply("mm", {&ca, &cb})) return mm(ca, cb);
  }
  check_operands("mm", a, b);
  LOOM_CHECK(a.dim() == 2 && b.dim() == 2, "mm: expected 2-D tensors, got shapes ", a.shape(), " and ", b.shape(),
             "; use matmul for 1-D or batched operands");
  LOOM_CHECK(a.size(1) == b.size(0), "mat1 and mat2 shapes cannot be multiplied (", matrix_str(a), " and ",
             matrix_str(b), "): the first's columns must equal the second's rows");
  Tensor out = empty({a.size(0), b.size(1)}, TensorOptions(a.dtype()).device(a.device()));
  mm_kernel(a.device())(gemm_operand(a), gemm_operand(b), 0.0, out);
  FlopCounterMode::add_flops(2 * a.size(0) * a.size(1) * b.size(1));
  if (any_requires_grad({a, b})) {
    const bool ra = a.requires_grad(), rb = b.requires_grad();
    // Each operand is saved only if the *other* one needs a gradient.
    record("MmBackward", {a, b}, {out},
           [a_ = SavedTensor(rb ? a : Tensor(), "MmBackward"), b_ = SavedTensor(ra ? b : Tensor(), "MmBackward"), ra,
            rb](const Grads& g) {
             return Grads{ra ? mm(g[0], b_.get().t()) : Tensor(), rb ? mm(a_.get().t(), g[0]) : Tensor()};
           });
  }
  return out;
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  if (autocast::any_enabled()) {  // See Note [Autocast at op entry]
    Tensor ca = a, cb = b;
    if (autocast::apply("bmm", {&ca, &cb})) return bmm(ca, cb);
  }
  check_operands("bmm", a, b);
  LOOM_CHECK(a.dim() == 3 && b.dim() == 3, "bmm: expected 3-D tensors [batch, rows, cols], got shapes ", a.shape(),
             " and ", b.shape());
  LOOM_CHECK(a.size(0) == b.size(0), "bmm: batch sizes differ: ", a.shape(), " has ", a.size(0), " matrices and ",
             b.shape(), " has ", b.size(0));
  LOOM_CHECK(a.size(2) == b.size(1), "bmm: shapes ", a.shape(), " and ", b.shape(),
             " cannot be multiplied: expected the first's last dim (", a.size(2),
             ") to equal the second's middle dim (", b.size(1), ")");
  Tensor out = empty({a.size(0), a.size(1), b.size(2)}, TensorOptions(a.dtype()).device(a.device()));
  bmm_kernel(a.device())(gemm_operand(a), gemm_operand(b), out);
  FlopCounterMode::add_flops(2 * a.size(0) * a.size(1) * a.size(2) * b.size(2));
  if (any_requires_grad({a, b})) {
    const bool ra = a.requires_grad(), rb = b.requires_grad();
    record("BmmBackward", {a, b}, {out},
           [a_ = SavedTensor(rb ? a : Tensor(), "BmmBackward"), b_ = SavedTensor(ra ? b : Tensor(), "BmmBackward"),
            ra, rb](const Grads& g) {
             return Grads{ra ? bmm(g[0], b_.get().transpose(1, 2)) : Tensor(),
                          rb ? bmm(a_.get().transpose(1, 2), g[0]) : Tensor()};
           });
  }
  return out;
}

// Note [matmul's cases], as torch.matmul:
//   1-D @ 1-D      dot product, a 0-dim result
//   2-D @ 2-D      mm
//   1-D @ 2-D      the vector becomes a [1, K] matrix, then that dim is dropped
//   2-D @ 1-D      the vector becomes a [K, 1] matrix, then that dim is dropped
//   N-D @ 1-D/2-D  (N >= 3) the batch dims of a fold into its rows: one mm, not a bmm
//   otherwise      batched: the batch dims (all but the last two) broadcast, the
//                  operands are expanded and flattened to [batch, M, K] @ [batch, K, N]
//                  for one bmm, and the result is unflattened. 1-D operands are
//                  promoted as above and the added dim dropped again.
// Gradients come from the pieces: mm/bmm, and the views' backward (an expanded
// operand's gradient is summed back over the broadcast batch dims).
Tensor matmul(const Tensor& a, const Tensor& b) {
  if (autocast::any_enabled()) {  // See Note [Autocast at op entry]
    Tensor ca = a, cb = b;
    if (autocast::apply("matmul", {&ca, &cb})) return matmul(ca, cb);
  }
  check_operands("matmul", a, b);
  LOOM_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: both arguments need at least 1 dimension, got shapes ",
             a.shape(), " and ", b.shape());
  const int64_t k_a = a.size(-1), k_b = b.dim() == 1 ? b.size(0) : b.size(-2);
  if (a.dim() == 1 && b.dim() == 1) {
    LOOM_CHECK(k_a == k_b, "matmul: a dot product needs 1-D tensors of the same size, got shapes ", a.shape(),
               " and ", b.shape());
    return mm(a.unsqueeze(0), b.unsqueeze(1)).reshape({});
  }
  LOOM_CHECK(k_a == k_b, "matmul: shapes ", a.shape(), " and ", b.shape(),
             " cannot be multiplied: the first's last dim (", k_a, ") must equal the second's ",
             b.dim() == 1 ? "size (" : "second-to-last dim (", k_b, ")");
  if (a.dim() <= 2 && b.dim() <= 2) {
    Tensor a2 = a.dim() == 1 ? a.unsqueeze(0) : a;
    Tensor b2 = b.dim() == 1 ? b.unsqueeze(1) : b;
    Tensor out = mm(a2, b2);
    if (a.dim() == 1) return out.squeeze(0);
    if (b.dim() == 1) return out.squeeze(1);
    return out;
  }
  if (a.dim() >= 3 && b.dim() <= 2) {
    Shape out_shape(a.shape().begin(), a.shape().end() - 1);
    if (b.dim() == 2) out_shape.push_back(b.size(1));
    Tensor b2 = b.dim() == 1 ? b.unsqueeze(1) : b;
    return mm(a.reshape({-1, k_a}), b2).reshape(out_shape);
  }
  // Batched, with broadcasting.
  Tensor a3 = a.dim() == 1 ? a.unsqueeze(0) : a;
  Tensor b3 = b.dim() == 1 ? b.unsqueeze(1) : b;
  const Shape batch_a(a3.shape().begin(), a3.shape().end() - 2);
  const Shape batch_b(b3.shape().begin(), b3.shape().end() - 2);
  Shape batch;
  try {
    batch = broadcast_shapes(batch_a, batch_b);
  } catch (const Error&) {
    LOOM_FAIL("matmul: the batch dims of ", a.shape(), " and ", b.shape(), " (", batch_a, " and ", batch_b,
              ") do not broadcast");
  }
  const int64_t m = a3.size(-2), n = b3.size(-1), flat = numel(batch);
  Shape a_full = batch, b_full = batch;
  a_full.insert(a_full.end(), {m, k_a});
  b_full.insert(b_full.end(), {k_b, n});
  Tensor out = bmm(a3.expand(a_full).reshape({flat, m, k_a}), b3.expand(b_full).reshape({flat, k_b, n}));
  Shape out_shape = batch;
  if (a.dim() > 1) out_shape.push_back(m);
  if (b.dim() > 1) out_shape.push_back(n);
  return out.reshape(out_shape);
}

// x [.., in] @ weight[out, in]^T + bias[out]. A 2-D x takes one gemm on weight's
// transposed view (Note [Transposed operands are free]), with the bias pre-filled into
// the output rows and accumulated onto by the gemm (beta = 1): no separate bias pass.
// Other ranks fold their leading dims into rows, as matmul does.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (autocast::any_enabled()) {  // See Note [Autocast at op entry]
    Tensor cx = x, cw = weight, cb = bias;
    if (autocast::apply("linear", {&cx, &cw, &cb})) return linear(cx, cw, cb);
  }
  check_operands("linear", x, weight);
  LOOM_CHECK(weight.dim() == 2, "linear: expected a 2-D weight [out_features, in_features], got shape ",
             weight.shape());
  LOOM_CHECK(x.dim() >= 1, "linear: expected an input with at least 1 dimension, got a 0-dim tensor");
  if (bias.defined()) {
    check_operands("linear", x, bias);
    LOOM_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), "linear: expected a bias of shape [",
               weight.size(0), "] (out_features of weight ", weight.shape(), "), got ", bias.shape());
  }
  const int64_t in = weight.size(1);
  LOOM_CHECK(x.size(-1) == in, "mat1 and mat2 shapes cannot be multiplied (",
             x.numel() / std::max<int64_t>(x.size(-1), 1), "x", x.size(-1), " and ", in, "x", weight.size(0),
             "): linear's input ", x.shape(), " must end in in_features=", in, " of weight ", weight.shape());
  if (x.dim() != 2) {
    Shape out_shape(x.shape().begin(), x.shape().end() - 1);
    out_shape.push_back(weight.size(0));
    return linear(x.reshape({-1, in}), weight, bias).reshape(out_shape);
  }

  Tensor out = empty({x.size(0), weight.size(0)}, TensorOptions(x.dtype()).device(x.device()));
  if (bias.defined()) copy_into(out, bias.detach().expand(out.shape()));
  mm_kernel(x.device())(gemm_operand(x), gemm_operand(weight).t(), bias.defined() ? 1.0 : 0.0,
                        out);
  FlopCounterMode::add_flops(2 * x.size(0) * in * weight.size(0));
  if (any_requires_grad({x, weight, bias})) {
    const bool rx = x.requires_grad(), rw = weight.requires_grad(), rb = bias.defined() && bias.requires_grad();
    std::vector<Tensor> inputs = {x, weight};
    if (bias.defined()) inputs.push_back(bias);
    record("LinearBackward", inputs, {out},
           [x_ = SavedTensor(rw ? x : Tensor(), "LinearBackward"),
            w_ = SavedTensor(rx ? weight : Tensor(), "LinearBackward"), rx, rw, rb,
            has_bias = bias.defined()](const Grads& g) {
             Grads grads = {rx ? mm(g[0], w_.get()) : Tensor(),       // dx = dy @ W
                            rw ? mm(g[0].t(), x_.get()) : Tensor()};  // dW = dy^T @ x
             if (has_bias) grads.push_back(rb ? sum(g[0], {0}) : Tensor());  // db = dy summed over rows
             return grads;
           });
  }
  return out;
}

}  // namespace loom
