// Elementwise ops with broadcasting: forward and gradient side by side.
#include <cmath>

#include "autograd/ops.h"
#include "autograd/ops/common.h"

namespace loom {
namespace {

using ops::check_same_device_dtype;
using Grads = std::vector<Tensor>;

// The result keeps its inputs' memory format, as PyTorch's TensorIterator: channels-last
// if an input of the result's shape is (Note [Channels-last activations]).
MemoryFormat result_format(const Shape& shape, std::initializer_list<const Tensor*> inputs) {
  for (const Tensor* t : inputs)
    if (t->shape() == shape && t->suggest_memory_format() == MemoryFormat::ChannelsLast) return MemoryFormat::ChannelsLast;
  return MemoryFormat::Contiguous;
}

Tensor binary_forward(const char* name, BinaryOp op, const Tensor& a, const Tensor& b, double alpha) {
  check_same_device_dtype(name, a, b);
  if (alpha != 1.0) check_scalar_fits(alpha, a.dtype(), "alpha");
  // PyTorch's `/` of integer tensors is true division, giving floats; loom does not
  // promote dtypes, so rather than truncate (or crash on a zero divisor) it refuses.
  LOOM_CHECK(op != BinaryOp::Div || is_floating(a.dtype()), name, ": dividing ", a.dtype(), " tensors: PyTorch's "
             "division of integers gives floats, and loom does not promote dtypes; convert first, e.g. "
             "a.to(kFloat32) / b.to(kFloat32)");
  Shape shape = broadcast_shapes(a.shape(), b.shape());
  bool compare = op >= BinaryOp::Eq;
  Tensor out = empty(shape, TensorOptions(compare ? kBool : a.dtype()).device(a.device()), result_format(shape, {&a, &b}));
  binary_kernel(a.device())(op, a.detach().expand(shape), b.detach().expand(shape), alpha, out);
  return out;
}

Tensor unary_forward(UnaryOp op, const Tensor& x) {
  ops::check_defined("unary op", x, "input");
  Tensor out = empty_like(x);
  unary_kernel(x.device())(op, x, out);
  return out;
}

}  // namespace

Tensor wrap_scalar(double value, const Tensor& like) {
  check_scalar_fits(value, like.dtype(), "a scalar operand");
  return scalar_tensor(value, TensorOptions(like.dtype()).device(like.device()));
}

Tensor sum_to(const Tensor& grad, const Shape& shape) {
  if (grad.shape() == shape) return grad;
  // Sum away leading dims that broadcasting added, then dims that were 1 in `shape`.
  const int64_t lead = grad.dim() - static_cast<int64_t>(shape.size());
  Shape dims;
  for (int64_t d = 0; d < grad.dim(); ++d) {
    if (d < lead || (shape[d - lead] == 1 && grad.size(d) != 1)) dims.push_back(d);
  }
  Tensor reduced = dims.empty() ? grad : sum(grad, dims, /*keepdim=*/true);
  return reduced.reshape(shape);
}

Tensor add(const Tensor& a, const Tensor& b, double alpha) {
  Tensor out = binary_forward("add", BinaryOp::Add, a, b, alpha);
  if (any_requires_grad({a, b})) {
    record("AddBackward", {a, b}, {out}, [sa = a.shape(), sb = b.shape(), alpha](const Grads& g) {
      return Grads{sum_to(g[0], sa), sum_to(alpha == 1.0 ? g[0] : g[0] * alpha, sb)};
    });
  }
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b, double alpha) {
  Tensor out = binary_forward("sub", BinaryOp::Sub, a, b, alpha);
  if (any_requires_grad({a, b})) {
    record("SubBackward", {a, b}, {out}, [sa = a.shape(), sb = b.shape(), alpha](const Grads& g) {
      return Grads{sum_to(g[0], sa), sum_to(g[0] * -alpha, sb)};
    });
  }
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward("mul", BinaryOp::Mul, a, b, 1.0);
  if (any_requires_grad({a, b})) {
    record("MulBackward", {a, b}, {out},
           [a_ = SavedTensor(b.requires_grad() ? a : Tensor(), "MulBackward"),
            b_ = SavedTensor(a.requires_grad() ? b : Tensor(), "MulBackward"), ra = a.requires_grad(),
            rb = b.requires_grad(), sa = a.shape(), sb = b.shape()](const Grads& g) {
             return Grads{ra ? sum_to(g[0] * b_.get(), sa) : Tensor(), rb ? sum_to(g[0] * a_.get(), sb) : Tensor()};
           });
  }
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward("div", BinaryOp::Div, a, b, 1.0);
  if (any_requires_grad({a, b})) {
    record("DivBackward", {a, b}, {out},
           [a_ = SavedTensor(a, "DivBackward"), b_ = SavedTensor(b, "DivBackward"), ra = a.requires_grad(),
            rb = b.requires_grad()](const Grads& g) {
             const Tensor& bv = b_.get();
             Tensor ga = ra ? sum_to(g[0] / bv, a_.get().shape()) : Tensor();
             // d(a/b)/db = -a / b^2
             Tensor gb = rb ? sum_to(-(g[0] * a_.get()) / (bv * bv), bv.shape()) : Tensor();
             return Grads{ga, gb};
           });
  }
  return out;
}

namespace {
// maximum/minimum: the gradient goes to the selected operand (split evenly on ties,
// as PyTorch does).
Tensor extremum(const char* name, BinaryOp op, const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward(name, op, a, b, 1.0);
  if (any_requires_grad({a, b})) {
    record(op == BinaryOp::Maximum ? "MaximumBackward" : "MinimumBackward", {a, b}, {out},
           [a_ = SavedTensor(a, name), b_ = SavedTensor(b, name), op](const Grads& g) {
             const Tensor& av = a_.get();
             const Tensor& bv = b_.get();
             // a is the output where it wins or is NaN (NaN propagates from either side).
             Tensor a_wins = (op == BinaryOp::Maximum ? gt(av, bv) : lt(av, bv)).to(g[0].dtype()) +
                             ne(av, av).to(g[0].dtype());
             Tensor tie = eq(av, bv).to(g[0].dtype()) * 0.5;
             Tensor share_a = a_wins + tie;
             Tensor share_b = (1.0 - a_wins) - tie;
             return Grads{sum_to(g[0] * share_a, av.shape()), sum_to(g[0] * share_b, bv.shape())};
           });
  }
  return out;
}
}  // namespace

Tensor maximum(const Tensor& a, const Tensor& b) { return extremum("maximum", BinaryOp::Maximum, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return extremum("minimum", BinaryOp::Minimum, a, b); }

Tensor neg(const Tensor& x) {
  Tensor out = unary_forward(UnaryOp::Neg, x);
  if (any_requires_grad({x})) record("NegBackward", {x}, {out}, [](const Grads& g) { return Grads{-g[0]}; });
  return out;
}

Tensor exp(const Tensor& x) {
  Tensor out = unary_forward(UnaryOp::Exp, x);
  if (any_requires_grad({x}))
    record("ExpBackward", {x}, {out}, [y = SavedTensor(out, "ExpBackward")](const Grads& g) { return Grads{g[0] * y.get()}; });
  return out;
}

Tensor log(const Tensor& x) {
  Tensor out = unary_forward(UnaryOp::Log, x);
  if (any_requires_grad({x}))
    record("LogBackward", {x}, {out}, [x_ = SavedTensor(x, "LogBackward")](const Grads& g) { return Grads{g[0] / x_.get()}; });
  return out;
}

Tensor sqrt(const Tensor& x) {
  Tensor out = unary_forward(UnaryOp::Sqrt, x);
  if (any_requires_grad({x}))
    record("SqrtBackward", {x}, {out},
           [y = SavedTensor(out, "SqrtBackward")](const Grads& g) { return Grads{g[0] / (y.get() * 2.0)}; });
  return out;
}

Tensor rsqrt(const Tensor& x) {
  Tensor out = unary_forward(UnaryOp::Rsqrt, x);
  if (any_requires_grad({x})) {
    // d(x^-1/2)/dx = -1/2 x^-3/2 = -1/2 y^3
    record("RsqrtBackward", {x}, {out}, [y = SavedTensor(out, "RsqrtBackward")](const Grads& g) {
      const Tensor& yv = y.get();
      return Grads{g[0] * (yv * yv * yv) * -0.5};
    });
  }
  return out;
}

Tensor pow(const Tensor& x, double exponent) {
  ops::check_defined("pow", x, "input");
  Tensor out = empty_like(x);
  pow_scalar_kernel(x.device())(x, exponent, out);
  if (any_requires_grad({x})) {
    record("PowBackward", {x}, {out}, [x_ = SavedTensor(x, "PowBackward"), exponent](const Grads& g) {
      if (exponent == 0.0) return Grads{zeros_like(g[0])};
      return Grads{g[0] * pow(x_.get(), exponent - 1.0) * exponent};
    });
  }
  return out;
}

Tensor abs(const Tensor& x) {
  Tensor out = unary_forward(UnaryOp::Abs, x);
  if (any_requires_grad({x})) {
    record("AbsBackward", {x}, {out}, [x_ = SavedTensor(x, "AbsBackward")](const Grads& g) {
      const Tensor& xv = x_.get();
      Tensor zero = wrap_scalar(0, xv);
      Tensor sign = gt(xv, zero).to(xv.dtype()) - lt(xv, zero).to(xv.dtype());
      return Grads{g[0] * sign};
    });
  }
  return out;
}

Tensor clamp(const Tensor& x, double min, double max) {
  ops::check_defined("clamp", x, "input");
  LOOM_CHECK(min <= max, "clamp: expected min <= max, got min=", min, " max=", max);
  Tensor out = empty_like(x);
  clamp_kernel(x.device())(x, min, max, out);
  if (any_requires_grad({x})) {
    record("ClampBackward", {x}, {out}, [x_ = SavedTensor(x, "ClampBackward"), min, max](const Grads& g) {
      const Tensor& xv = x_.get();
      Tensor inside = where(ge(xv, wrap_scalar(min, xv)), le(xv, wrap_scalar(max, xv)), wrap_scalar(0, xv).to(kBool));
      return Grads{where(inside, g[0], zeros_like(g[0]))};
    });
  }
  return out;
}

Tensor relu(const Tensor& x) {
  Tensor out = unary_forward(UnaryOp::Relu, x);
  if (any_requires_grad({x})) {
    record("ReluBackward", {x}, {out}, [y = SavedTensor(out, "ReluBackward")](const Grads& g) {
      Tensor grad_in = empty_like(g[0]);
      threshold_backward_kernel(g[0].device())(g[0], y.get(), 0.0, grad_in);
      return Grads{grad_in};
    });
  }
  return out;
}

Tensor sigmoid(const Tensor& x) {
  Tensor out = unary_forward(UnaryOp::Sigmoid, x);
  if (any_requires_grad({x})) {
    record("SigmoidBackward", {x}, {out}, [y = SavedTensor(out, "SigmoidBackward")](const Grads& g) {
      const Tensor& yv = y.get();
      return Grads{g[0] * yv * (1.0 - yv)};
    });
  }
  return out;
}

Tensor tanh(const Tensor& x) {
  Tensor out = unary_forward(UnaryOp::Tanh, x);
  if (any_requires_grad({x})) {
    record("TanhBackward", {x}, {out}, [y = SavedTensor(out, "TanhBackward")](const Grads& g) {
      const Tensor& yv = y.get();
      return Grads{g[0] * (1.0 - yv * yv)};
    });
  }
  return out;
}

Tensor eq(const Tensor& a, const Tensor& b) { return binary_forward("eq", BinaryOp::Eq, a, b, 1.0); }
Tensor ne(const Tensor& a, const Tensor& b) { return binary_forward("ne", BinaryOp::Ne, a, b, 1.0); }
Tensor lt(const Tensor& a, const Tensor& b) { return binary_forward("lt", BinaryOp::Lt, a, b, 1.0); }
Tensor le(const Tensor& a, const Tensor& b) { return binary_forward("le", BinaryOp::Le, a, b, 1.0); }
Tensor gt(const Tensor& a, const Tensor& b) { return binary_forward("gt", BinaryOp::Gt, a, b, 1.0); }
Tensor ge(const Tensor& a, const Tensor& b) { return binary_forward("ge", BinaryOp::Ge, a, b, 1.0); }

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  check_same_device_dtype("where", a, b);
  LOOM_CHECK(cond.dtype() == kBool, "where: condition must be a bool tensor, got ", cond.dtype());
  LOOM_CHECK(cond.device() == a.device(), "where: condition is on ", cond.device(), " but values are on ", a.device());
  Shape shape = broadcast_shapes(broadcast_shapes(cond.shape(), a.shape()), b.shape());
  Tensor out = empty(shape, TensorOptions(a.dtype()).device(a.device()), result_format(shape, {&a, &b}));
  where_kernel(a.device())(cond.expand(shape), a.detach().expand(shape), b.detach().expand(shape), out);
  if (any_requires_grad({a, b})) {
    record("WhereBackward", {a, b}, {out},
           [c = SavedTensor(cond, "WhereBackward"), sa = a.shape(), sb = b.shape()](const Grads& g) {
             Tensor zero = zeros_like(g[0]);
             return Grads{sum_to(where(c.get(), g[0], zero), sa), sum_to(where(c.get(), zero, g[0]), sb)};
           });
  }
  return out;
}

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator-(const Tensor& x) { return neg(x); }
Tensor operator+(const Tensor& a, double b) { return add(a, wrap_scalar(b, a)); }
Tensor operator-(const Tensor& a, double b) { return sub(a, wrap_scalar(b, a)); }
Tensor operator*(const Tensor& a, double b) { return mul(a, wrap_scalar(b, a)); }
Tensor operator/(const Tensor& a, double b) { return div(a, wrap_scalar(b, a)); }
Tensor operator+(double a, const Tensor& b) { return add(wrap_scalar(a, b), b); }
Tensor operator-(double a, const Tensor& b) { return sub(wrap_scalar(a, b), b); }
Tensor operator*(double a, const Tensor& b) { return mul(wrap_scalar(a, b), b); }
Tensor operator/(double a, const Tensor& b) { return div(wrap_scalar(a, b), b); }
Tensor operator==(const Tensor& a, const Tensor& b) { return eq(a, b); }
Tensor operator<(const Tensor& a, const Tensor& b) { return lt(a, b); }
Tensor operator>(const Tensor& a, const Tensor& b) { return gt(a, b); }

}  // namespace loom
