// nn::Module: registries and dotted names, train/eval, zero_grad, to(), apply, clone,
// state_dict / load_state_dict, Sequential.
#include <doctest/doctest.h>

#include "autograd/ops.h"
#include "nn/nn.h"

using namespace loom;

namespace {

// A small model with a buffer of its own, a nested child and a Sequential.
class Net : public nn::Cloneable<Net> {
 public:
  Net() : Cloneable("Net") { reset(); }
  void reset() override {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(4, 3));
    scale = register_parameter("scale", ones({3}));
    steps = register_buffer("steps", zeros({}, kInt64));
    head = register_module("head", std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
        std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(3, 2, /*bias=*/false)}));
    bn = register_module("bn", std::make_shared<nn::BatchNorm2d>(2));
  }
  Tensor forward(const Tensor& x) override { return head->forward(fc1->forward(x) * scale); }

  std::shared_ptr<nn::Linear> fc1;
  std::shared_ptr<nn::Sequential> head;
  std::shared_ptr<nn::BatchNorm2d> bn;
  Tensor scale, steps;
};

// Registers in its constructor only: clone() must refuse it with advice.
class NotCloneable : public nn::Module {
 public:
  NotCloneable() : Module("NotCloneable") { register_parameter("w", zeros({2})); }
};

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("named_parameters, named_buffers and named_modules use PyTorch's dotted names and order") {
  auto net = std::make_shared<Net>();
  CHECK(net->named_parameters().keys() ==
        std::vector<std::string>{"scale", "fc1.weight", "fc1.bias", "head.1.weight", "bn.weight", "bn.bias"});
  CHECK(net->named_parameters(/*recurse=*/false).keys() == std::vector<std::string>{"scale"});
  CHECK(net->parameters().size() == 6);
  CHECK(net->named_buffers().keys() ==
        std::vector<std::string>{"steps", "bn.running_mean", "bn.running_var", "bn.num_batches_tracked"});
  CHECK(net->named_children().keys() == std::vector<std::string>{"fc1", "head", "bn"});
  CHECK(net->named_modules().keys() == std::vector<std::string>{"", "fc1", "head", "head.0", "head.1", "bn"});
  for (const Tensor& p : net->parameters()) {
    CHECK(p.requires_grad());
    CHECK(p.is_leaf());
  }
  // Members and registries are the same tensors.
  CHECK(net->named_parameters()["fc1.weight"].is_same(net->fc1->weight));
}

TEST_CASE("state_dict holds parameters then buffers per module, aliasing the module's storage") {
  auto net = std::make_shared<Net>();
  auto sd = net->state_dict();
  CHECK(sd.keys() == std::vector<std::string>{"scale", "steps", "fc1.weight", "fc1.bias", "head.1.weight", "bn.weight",
                                              "bn.bias", "bn.running_mean", "bn.running_var",
                                              "bn.num_batches_tracked"});
  CHECK_FALSE(sd["scale"].requires_grad());
  CHECK(sd["scale"].storage() == net->scale.storage());
}

TEST_CASE("registration rejects bad names and kind clashes") {
  nn::Module m;
  CHECK_THROWS_WITH_AS(m.register_parameter("a.b", zeros({1})), doctest::Contains("contains '.'"), Error);
  CHECK_THROWS_WITH_AS(m.register_parameter("", zeros({1})), doctest::Contains("cannot be empty"), Error);
  m.register_parameter("w", zeros({1}));
  CHECK_THROWS_WITH_AS(m.register_buffer("w", zeros({1})), doctest::Contains("different kind"), Error);
  CHECK_THROWS_WITH_AS(m.register_parameter("i", zeros({1}, kInt64)), doctest::Contains("floating point"), Error);
  m.register_parameter("w", ones({2}));  // same kind: replaced
  CHECK(m.named_parameters()["w"].shape() == Shape{2});
}

TEST_CASE("Parameter makes a leaf that requires grad, sharing storage") {
  Tensor data = zeros({3});
  Tensor p = nn::Parameter(data);
  CHECK(p.requires_grad());
  CHECK(p.is_leaf());
  CHECK(p.storage() == data.storage());
  CHECK_FALSE(data.requires_grad());
}

TEST_CASE("train and eval recurse into every descendant") {
  auto net = std::make_shared<Net>();
  CHECK(net->is_training());
  net->eval();
  for (const auto& m : net->modules()) CHECK_FALSE(m->is_training());
  net->train();
  for (const auto& m : net->modules()) CHECK(m->is_training());
}

TEST_CASE("zero_grad drops gradients or zeroes them") {
  auto net = std::make_shared<Net>();
  for (const Tensor& p : net->parameters()) p.set_grad(ones_like(p));
  net->zero_grad(/*set_to_none=*/false);
  for (const Tensor& p : net->parameters()) {
    REQUIRE(p.grad().defined());
    for (float v : p.grad().tolist<float>()) CHECK(v == 0.0f);
  }
  net->zero_grad();
  for (const Tensor& p : net->parameters()) CHECK_FALSE(p.grad().defined());
}

TEST_CASE("to(dtype) and to(device) convert in place: handles see the change, parameters stay leaves") {
  auto net = std::make_shared<Net>();
  Tensor weight = net->fc1->weight;  // a handle taken before the move (as an optimizer holds)
  auto before = weight.tolist<float>();
  weight.set_grad(ones_like(weight));
  net->to(kFloat64);
  CHECK(weight.dtype() == kFloat64);
  CHECK(weight.requires_grad());
  CHECK(weight.is_leaf());
  CHECK(weight.grad().dtype() == kFloat64);
  CHECK(net->bn->running_var.dtype() == kFloat64);
  CHECK(net->bn->num_batches_tracked.dtype() == kInt64);  // integer buffers keep their dtype
  CHECK(net->steps.dtype() == kInt64);
  auto after = weight.tolist<double>();
  for (size_t i = 0; i < before.size(); ++i) CHECK(after[i] == doctest::Approx(before[i]));

  net->to(Device("cpu:1"));
  for (const Tensor& t : net->state_dict().values()) CHECK(t.device() == Device("cpu:1"));
  CHECK(weight.device() == Device("cpu:1"));
  CHECK(weight.grad().device() == Device("cpu:1"));
  CHECK_THROWS_WITH_AS(net->to(kInt64), doctest::Contains("floating-point"), Error);
}

TEST_CASE("apply visits children before their parent") {
  auto net = std::make_shared<Net>();
  std::vector<std::string> order;
  net->apply([&](nn::Module& m) { order.push_back(m.type_name()); });
  CHECK(order == std::vector<std::string>{"Linear", "ReLU", "Linear", "Sequential", "BatchNorm2d", "Net"});
}

TEST_CASE("clone is a deep copy: equal values, separate storage, same flags") {
  auto net = std::make_shared<Net>();
  net->fc1->bias.requires_grad_(false);  // a frozen parameter stays frozen in the copy
  net->eval();
  net->fc1->weight.set_grad(ones_like(net->fc1->weight));
  const uint64_t offset_before = default_generator().offset();
  auto copy = std::dynamic_pointer_cast<Net>(net->clone());
  REQUIRE(copy);
  CHECK(default_generator().offset() == offset_before);  // See Note [Skipping initialisation]
  auto a = net->state_dict(), b = copy->state_dict();
  REQUIRE(a.keys() == b.keys());
  for (const auto& [name, t] : a) {
    CHECK(b[name].storage() != t.storage());
    CHECK(b[name].shape() == t.shape());
    CHECK(b[name].dtype() == t.dtype());
    if (t.dtype() == kFloat32) CHECK(b[name].tolist<float>() == t.tolist<float>());
  }
  // Member handles point into the copy, not the original.
  CHECK(copy->fc1->weight.is_same(copy->named_parameters()["fc1.weight"]));
  CHECK(copy->head->at<nn::Linear>(1)->weight.storage() != net->head->at<nn::Linear>(1)->weight.storage());
  CHECK_FALSE(copy->is_training());
  CHECK_FALSE(copy->fc1->is_training());
  CHECK_FALSE(copy->fc1->bias.requires_grad());
  CHECK(copy->fc1->weight.requires_grad());
  CHECK_FALSE(copy->fc1->weight.grad().defined());
  {
    NoGradGuard no_grad;
    copy->scale.fill_(5);
  }
  CHECK(net->scale.tolist<float>() == std::vector<float>{1, 1, 1});

  auto moved = net->clone(Device("cpu:2"));
  for (const Tensor& t : moved->state_dict().values()) CHECK(t.device() == Device("cpu:2"));
}

TEST_CASE("clone of a module without Cloneable explains what to do") {
  auto m = std::make_shared<NotCloneable>();
  CHECK(error_of([&] { m->clone(); }).find("nn::Cloneable<NotCloneable>") != std::string::npos);
}

TEST_CASE("load_state_dict copies values in place and reports key problems") {
  auto src = std::make_shared<Net>();
  auto dst = std::make_shared<Net>();
  Tensor dst_weight = dst->fc1->weight;
  {
    NoGradGuard no_grad;
    src->scale.fill_(3);
  }
  auto result = dst->load_state_dict(src->state_dict());
  CHECK(result.missing_keys.empty());
  CHECK(result.unexpected_keys.empty());
  CHECK(dst->fc1->weight.is_same(dst_weight));  // in place
  CHECK(dst->fc1->weight.tolist<float>() == src->fc1->weight.tolist<float>());
  CHECK(dst->scale.tolist<float>() == std::vector<float>{3, 3, 3});

  auto partial = src->state_dict();
  OrderedDict<Tensor> broken;
  for (const auto& [k, v] : partial)
    if (k != "fc1.bias") broken.insert(k, v);
  broken.insert("extra.weight", zeros({1}));
  std::string message = error_of([&] { dst->load_state_dict(broken); });
  CHECK(message.find("missing keys (1): \"fc1.bias\"") != std::string::npos);
  CHECK(message.find("unexpected keys (1): \"extra.weight\"") != std::string::npos);
  auto lenient = dst->load_state_dict(broken, /*strict=*/false);
  CHECK(lenient.missing_keys == std::vector<std::string>{"fc1.bias"});
  CHECK(lenient.unexpected_keys == std::vector<std::string>{"extra.weight"});
}

TEST_CASE("load_state_dict names every shape and dtype mismatch and changes nothing") {
  auto dst = std::make_shared<Net>();
  auto before = dst->scale.tolist<float>();
  auto sd = std::make_shared<Net>()->state_dict();
  sd.insert("fc1.weight", zeros({5, 4}));
  sd.insert("scale", full({3}, 9.0, kFloat64));
  std::string message = error_of([&] { dst->load_state_dict(sd); });
  CHECK(message.find("size mismatch for \"fc1.weight\"") != std::string::npos);
  CHECK(message.find("[5, 4]") != std::string::npos);
  CHECK(message.find("[3, 4]") != std::string::npos);
  CHECK(message.find("dtype mismatch for \"scale\"") != std::string::npos);
  CHECK(dst->scale.tolist<float>() == before);
}

TEST_CASE("Sequential numbers its children and chains them") {
  nn::Sequential seq;
  seq.push_back(std::make_shared<nn::Identity>());
  seq.push_back(std::make_shared<nn::Flatten>());
  CHECK(seq.named_children().keys() == std::vector<std::string>{"0", "1"});
  CHECK(seq.size() == 2);
  CHECK(seq.at<nn::Flatten>(1)->start_dim == 1);
  CHECK_THROWS_WITH_AS(seq.at<nn::Linear>(1), doctest::Contains("Flatten"), Error);
  CHECK_THROWS_WITH_AS(seq[2], doctest::Contains("out of range"), Error);
  Tensor x = arange(0, 12, 1, kFloat32).reshape({2, 3, 2});
  CHECK(seq.forward(x).shape() == Shape{2, 6});
}

TEST_CASE("str() prints the module tree like PyTorch's print(model)") {
  auto net = std::make_shared<Net>();
  std::string s = net->str();
  CHECK(s.find("Net(\n  (fc1): Linear(in_features=4, out_features=3, bias=True)\n") == 0);
  CHECK(s.find("    (1): Linear(in_features=3, out_features=2, bias=False)") != std::string::npos);
  CHECK(s.find("(bn): BatchNorm2d(2, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True)") !=
        std::string::npos);
}

TEST_CASE("a module forward runs through operator() and backward reaches every parameter") {
  auto net = std::make_shared<Net>();
  Tensor x = randn({5, 4});
  Tensor y = (*net)(x);
  CHECK(y.shape() == Shape{5, 2});
  y.sum().backward();
  for (const auto& [key, p] : net->named_parameters()) {
    const std::string& name = key;  // See Note [doctest messages name no structured binding]
    if (name.rfind("bn.", 0) == 0) continue;  // bn is not used in forward
    CHECK_MESSAGE(p.grad().defined(), name);
  }
}

TEST_CASE("a module cannot be registered below itself: a cycle would make every traversal endless") {
  auto outer = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{std::make_shared<nn::ReLU>()});
  auto inner = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{});
  outer->register_module("inner", inner);
  CHECK_THROWS_WITH_AS(outer->register_module("self", outer), doctest::Contains("is this module itself"), Error);
  CHECK_THROWS_WITH_AS(inner->register_module("up", outer), doctest::Contains("contains this module"), Error);
  // The same module twice (a shared layer) is no cycle.
  auto relu = std::make_shared<nn::ReLU>();
  inner->register_module("a", relu);
  inner->register_module("b", relu);
  CHECK(outer->named_modules().size() >= 3);
}

TEST_CASE("forward hooks run around forward in module(x), in order, are cloned, and a direct forward is refused") {
  auto fc = std::make_shared<nn::Linear>(2, 2);
  std::vector<std::string> ran;
  fc->register_forward_pre_hook([&ran](nn::Module&, const Tensor& x) { ran.push_back("pre"); return x * 2.0; });
  fc->register_forward_hook([&ran](nn::Module&, const Tensor&, const Tensor& y) { ran.push_back("post"); return y + 1.0; });
  Tensor x = ones({1, 2});
  Tensor y;
  {
    NoGradGuard no_grad;
    y = (*fc)(x);
  }
  CHECK(ran == std::vector<std::string>{"pre", "post"});
  Tensor expected = linear(x * 2.0, fc->weight, fc->bias) + 1.0;
  CHECK(sub(y, expected).abs().max().item<float>() == 0.0f);
  // Through a parent, the child's hooks run too: Sequential calls module(x).
  auto seq = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{fc});
  ran.clear();
  (*seq)(x);
  CHECK(ran.size() == 2);
  // forward called directly would skip them: an error naming the way to call it.
  CHECK_THROWS_WITH_AS(fc->forward(x), doctest::Contains("call it as (*module)(x)"), Error);
  // A copy keeps them (as copy.deepcopy keeps a module's hooks).
  auto copy = std::dynamic_pointer_cast<nn::Linear>(fc->clone());
  ran.clear();
  (*copy)(x);
  CHECK(ran.size() == 2);
}
