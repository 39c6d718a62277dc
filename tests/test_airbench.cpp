// The speedrun's pieces, each against float64 truth or its defining formula: dirac_, flip and
// reflect pad (values and gradchecks), eigh, the whitening filters, frozen-weight BatchNorm,
// SGD + Nesterov with parameter groups, LambdaLR + interp, Lookahead (buffers included),
// the alternating flip and reflect translate of InMemoryLoader (and its rank slices), TTA's
// weights; then a short run of the whole recipe whose loss must fall.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "core/eigh.h"
#include "data/in_memory_loader.h"
#include "examples/speedrun/airbench94.h"
#include "gradcheck.h"
#include "nn/nn.h"
#include "nn/optim/lookahead.h"
#include "nn/test_time_augmentation.h"
#include "nn/whitening.h"
#include "tensor_compare.h"

using namespace loom;
using testing::max_abs_diff;

namespace {

Tensor identity(int64_t n) {
  std::vector<double> v(static_cast<size_t>(n * n), 0.0);
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i * n + i)] = 1.0;
  return from_vector(v, {n, n});
}

}  // namespace

TEST_CASE("dirac_ puts one 1 per (filter, its channel) at the kernel's centre, and the conv passes its input") {
  Tensor w = randn({6, 4, 3, 3});
  nn::init::dirac_(w);
  const auto v = w.tolist<float>();
  for (int64_t o = 0; o < 6; ++o)
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t k = 0; k < 9; ++k)
        CHECK(v[static_cast<size_t>(((o * 4 + i) * 9) + k)] == ((o == i && o < 4 && k == 4) ? 1.0f : 0.0f));
  Tensor x = randn({2, 4, 5, 5});
  Tensor y = conv2d(x, w, Tensor(), {1, 1}, {1, 1});
  CHECK(max_abs_diff(y.narrow(1, 0, 4), x) < 1e-5);  // Winograd rounds a little
  CHECK(max_abs_diff(y.narrow(1, 4, 2), zeros({2, 2, 5, 5})) == 0.0);
  // groups = 2: each group's identity on its own slice of filters; an even kernel's "centre" is k / 2.
  Tensor g = randn({4, 2, 2, 2});
  nn::init::dirac_(g, 2);
  const auto gv = g.tolist<float>();
  for (int64_t o = 0; o < 4; ++o)
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t k = 0; k < 4; ++k) CHECK(gv[static_cast<size_t>((o * 2 + i) * 4 + k)] == ((o % 2 == i && k == 3) ? 1.0f : 0.0f));
  // On a narrowed slice (airbench's w[:w.size(1)]): the rest of the tensor is left alone.
  Tensor big = ones({8, 3, 3, 3});
  nn::init::dirac_(big.narrow(0, 0, 3));
  CHECK(sum(big.narrow(0, 0, 3)).item<float>() == 3.0f);
  CHECK(sum(big.narrow(0, 3, 5)).item<float>() == 5 * 27.0f);
  CHECK_THROWS_WITH_AS(nn::init::dirac_(randn({4, 4})), doctest::Contains("3, 4, or 5 dimensions"), Error);
  CHECK_THROWS_WITH_AS(nn::init::dirac_(randn({5, 4, 3, 3}), 2), doctest::Contains("divisible by groups"), Error);
}

TEST_CASE("flip and pad: values as torch's, gradients by finite differences") {
  Tensor x = from_vector(std::vector<double>{0, 1, 2, 3}, {1, 1, 1, 4});
  CHECK(flip(x, {3}).tolist<double>() == std::vector<double>{3, 2, 1, 0});
  CHECK(pad(x, {2, 2}, "reflect").tolist<double>() == std::vector<double>{2, 1, 0, 1, 2, 3, 2, 1});
  CHECK(pad(x, {2, 2}, "replicate").tolist<double>() == std::vector<double>{0, 0, 0, 1, 2, 3, 3, 3});
  CHECK(pad(x, {2, 2}, "circular").tolist<double>() == std::vector<double>{2, 3, 0, 1, 2, 3, 0, 1});
  CHECK(pad(x, {1, 2}, "constant", 7).tolist<double>() == std::vector<double>{7, 0, 1, 2, 3, 7, 7});
  Tensor img = arange(0, 9, 1, TensorOptions(kFloat64)).view({1, 1, 3, 3});
  // F.pad(img, (1, 1, 1, 1), "reflect")'s first row is the reflected row 1: 4 3 4 5 4.
  CHECK(pad(img, {1, 1, 1, 1}, "reflect").narrow(2, 0, 1).flatten().tolist<double>() ==
        std::vector<double>{4, 3, 4, 5, 4});
  for (const char* mode : {"reflect", "replicate", "circular", "constant"}) {
    CAPTURE(mode);
    Tensor a = randn({2, 3, 4, 5}, TensorOptions(kFloat64)).requires_grad_(true);
    testing::gradcheck([&](const std::vector<Tensor>& in) { return pad(in[0], {2, 1, 3, 1}, mode); }, {a});
  }
  Tensor b = randn({2, 3, 4, 5}, TensorOptions(kFloat64)).requires_grad_(true);
  testing::gradcheck([](const std::vector<Tensor>& in) { return flip(in[0], {1, 3}); }, {b});
  CHECK_THROWS_WITH_AS(pad(img, {3, 3}, "reflect"), doctest::Contains("smaller than the dim"), Error);
  CHECK_THROWS_WITH_AS(pad(img, {1, 1}, "mirror"), doctest::Contains("mode must be"), Error);
  CHECK_THROWS_WITH_AS(flip(img, {1, 1}), doctest::Contains("multiple times"), Error);
}

TEST_CASE("eigh: A V = V diag(values), V orthonormal, values ascending") {
  Tensor m = randn({7, 7}, TensorOptions(kFloat64));
  Tensor a = mm(m, transpose(m, 0, 1)) + identity(7);
  auto [values, vectors] = linalg::eigh(a);
  const auto v = values.tolist<double>();
  for (size_t i = 1; i < v.size(); ++i) CHECK(v[i] >= v[i - 1]);
  CHECK(max_abs_diff(mm(a, vectors), vectors * values.unsqueeze(0)) < 1e-10);
  CHECK(max_abs_diff(mm(transpose(vectors, 0, 1), vectors), identity(7)) < 1e-12);
  CHECK_THROWS_WITH_AS(linalg::eigh(randn({2, 3})), doctest::Contains("square"), Error);
  CHECK_THROWS_WITH_AS(linalg::eigh(randn({2, 2}).requires_grad_(true)), doctest::Contains("no gradient"), Error);
}

TEST_CASE("whitening filters whiten: their outputs' second moment on the patches is diag(l / (l + eps))") {
  // Correlated images: smooth noise (neighbouring pixels and channels alike) plus a little white noise.
  Generator gen(5);
  Tensor base = randn({64, 1, 32, 32}, {}, &gen);
  Tensor images = (base.expand({64, 3, 32, 32}) + randn({64, 3, 32, 32}, {}, &gen) * 0.3).contiguous();
  images = (images + pad(images, {1, 0}, "replicate").narrow(3, 0, 32)).contiguous();
  nn::Conv2d conv(3, 24, 2, 1, 0);
  const double eps = 5e-4;
  nn::init_whitening_conv_(conv, images, eps);
  CHECK(sum(abs(conv.bias)).item<float>() == 0.0f);
  auto [values, rows] = nn::patch_principal_components(images, 2, 2);
  const Tensor patches = nn::image_patches(images, 2, 2);                  // [n, 12], float64
  const Tensor filters = conv.weight.narrow(0, 0, 12).reshape({12, 12}).to(kFloat64);
  const Tensor outputs = mm(patches, transpose(filters, 0, 1));              // the conv's first 12 channels
  const Tensor moment = mm(transpose(outputs, 0, 1), outputs) / static_cast<double>(patches.size(0));
  const Tensor expected = identity(12) * (values / (values + eps)).unsqueeze(0);
  CHECK(max_abs_diff(moment, expected) < 2e-5);  // float32 weights
  // The other 12 filters are the negatives, and the components come in decreasing order.
  CHECK(max_abs_diff(conv.weight.narrow(0, 12, 12), -conv.weight.narrow(0, 0, 12)) == 0.0);
  const auto l = values.tolist<double>();
  for (size_t i = 1; i < l.size(); ++i) CHECK(l[i] <= l[i - 1]);
  // The conv's own output (bias 0) on the images equals the patch products: the (c, h, w) order matches.
  Tensor y = conv.forward(images.narrow(0, 0, 1)).to(kFloat64);  // [1, 24, 31, 31]
  const Tensor first = outputs.narrow(0, 0, 31 * 31);              // image 0's patches, row-major
  CHECK(max_abs_diff(transpose(y.narrow(1, 0, 12).reshape({12, 31 * 31}), 0, 1), first) < 1e-4);
  nn::Conv2d wrong(3, 12, 2, 1, 0);
  CHECK_THROWS_WITH_AS(nn::init_whitening_conv_(wrong, images, eps), doctest::Contains("needs 2 * 12 = 24"), Error);
}

TEST_CASE("BatchNorm with a frozen weight: no weight gradient, input and bias gradients by finite differences") {
  nn::BatchNorm2d bn(3, 1e-12, 0.4);
  bn.to(kFloat64);
  bn.weight.requires_grad_(false);
  Tensor x = randn({4, 3, 5, 5}, TensorOptions(kFloat64)).requires_grad_(true);
  testing::gradcheck([&](const std::vector<Tensor>& in) { return bn.forward(in[0]); }, {x});
  testing::gradcheck(
      [&](const std::vector<Tensor>& in) {
        return batch_norm(x.detach(), Tensor(), Tensor(), bn.weight, in[0], true, 0.4, 1e-12);
      },
      {bn.bias});
  bn.zero_grad();
  sum(bn.forward(x) * randn({4, 3, 5, 5}, TensorOptions(kFloat64))).backward();
  CHECK_FALSE(bn.weight.grad().defined());
  CHECK(bn.bias.grad().defined());
  // airbench_param_split leaves the frozen weights out of both groups.
  auto net = nn::airbench94();
  const auto split = nn::airbench_param_split(*net);
  CHECK(split.norm_biases.size() == 6);
  std::set<const TensorImpl*> trainable;
  for (const Tensor& p : split.norm_biases) trainable.insert(p.unsafe_impl());
  for (const Tensor& p : split.others) trainable.insert(p.unsafe_impl());
  CHECK_FALSE(trainable.count(net->block1->norm1->weight.unsafe_impl()));
  CHECK(trainable.count(net->block1->norm1->bias.unsafe_impl()));
}

TEST_CASE("SGD, Nesterov, two parameter groups: three steps equal the float64 rule of torch.optim.SGD") {
  Tensor a = randn({5}).requires_grad_(true), b = randn({3}).requires_grad_(true);
  std::vector<double> pa = a.to(kFloat64).tolist<double>(), pb = b.to(kFloat64).tolist<double>();
  std::vector<double> ba(5), bb(3);
  std::vector<optim::ParamGroup> groups = {{{a}, {{"lr", 0.3}, {"weight_decay", 0.02}}},
                                          {{b}, {{"lr", 0.01}, {"weight_decay", 1.5}}}};
  optim::SGD opt(std::move(groups), {.momentum = 0.85, .nesterov = true});
  auto reference = [](std::vector<double>& p, std::vector<double>& buf, const std::vector<double>& g, double lr,
                      double wd, int step) {
    for (size_t i = 0; i < p.size(); ++i) {
      double d = g[i] + wd * p[i];
      buf[i] = step == 0 ? d : 0.85 * buf[i] + d;
      d = d + 0.85 * buf[i];
      p[i] -= lr * d;
    }
  };
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    Tensor ga = randn({5}), gb = randn({3});
    a.set_grad(ga);
    b.set_grad(gb);
    opt.step();
    reference(pa, ba, ga.to(kFloat64).tolist<double>(), 0.3, 0.02, step);
    reference(pb, bb, gb.to(kFloat64).tolist<double>(), 0.01, 1.5, step);
  }
  CHECK(max_abs_diff(a.to(kFloat64), from_vector(pa, {5})) < 1e-6);
  CHECK(max_abs_diff(b.to(kFloat64), from_vector(pb, {3})) < 1e-6);
}

TEST_CASE("LambdaLR with interp draws airbench's triangle, per step, per group") {
  Tensor p = zeros({1}).requires_grad_(true), q = zeros({1}).requires_grad_(true);
  std::vector<optim::ParamGroup> groups = {{{p}, {{"lr", 2.0}}}, {{q}, {{"lr", 0.5}}}};
  optim::SGD opt(std::move(groups), optim::SGDOptions{});
  const double T = 100;
  optim::LambdaLR sched(opt, [T](int64_t s) { return optim::interp(static_cast<double>(s), {0, 23, T}, {0.2, 1, 0.07}); });
  CHECK(opt.param_groups()[0]["lr"] == doctest::Approx(2.0 * 0.2));  // constructed: step 0
  for (int s = 1; s <= 23; ++s) sched.step();
  CHECK(opt.param_groups()[0]["lr"] == doctest::Approx(2.0));
  CHECK(opt.param_groups()[1]["lr"] == doctest::Approx(0.5));
  for (int s = 24; s <= 100; ++s) sched.step();
  CHECK(opt.param_groups()[0]["lr"] == doctest::Approx(2.0 * 0.07));
  CHECK(optim::interp(11.5, {0, 23, T}, {0.2, 1, 0.07}) == doctest::Approx(0.6));
  CHECK(optim::interp(-1, {0, 23, T}, {0.2, 1, 0.07}) == 0.2);
  CHECK(optim::interp(61.5, {0, 23, T}, {0.2, 1, 0.07}) == doctest::Approx(1 - 0.93 * 0.5));
  CHECK_THROWS_WITH_AS(optim::interp(1, {0, 0}, {1, 2}), doctest::Contains("increase strictly"), Error);
  CHECK_THROWS_WITH_AS(optim::LambdaLR(opt, std::vector<optim::LambdaLR::Lambda>{[](int64_t) { return 1.0; }}),
                       doctest::Contains("one per param group"), Error);
}

TEST_CASE("Lookahead averages weights and BatchNorm statistics, leaves counters, and copies the average back") {
  nn::Sequential net;
  net.push_back(std::make_shared<nn::Conv2d>(2, 3, 3));
  net.push_back(std::make_shared<nn::BatchNorm2d>(3));
  optim::Lookahead lookahead(net);
  std::map<std::string, std::vector<double>> start, moved;
  for (const auto& [name, t] : net.state_dict()) start[name] = t.to(kFloat64).tolist<double>();
  {  // Move the model: new weights, then new running statistics (one training forward).
    NoGradGuard no_grad;
    for (const Tensor& p : net.parameters()) p.detach().copy_(randn(p.shape()));
    net.forward(randn({4, 2, 6, 6}));
  }
  for (const auto& [name, t] : net.state_dict()) moved[name] = t.to(kFloat64).tolist<double>();
  const double decay = 0.7;
  lookahead.update(decay);
  for (const auto& entry : net.state_dict()) {  // Note [doctest messages name no structured binding]
    const std::string& name = entry.first;
    CAPTURE(name);
    const auto now = entry.second.to(kFloat64).tolist<double>();
    if (name.ends_with("num_batches_tracked")) {
      CHECK(now == moved[name]);  // integers: the model's own count
      continue;
    }
    CHECK(now != moved[name]);
    for (size_t i = 0; i < now.size(); ++i)
      CHECK(now[i] == doctest::Approx(decay * start[name][i] + (1 - decay) * moved[name][i]).epsilon(1e-6));
  }
  CHECK(lookahead.state_dict().contains("1.running_var"));
  {  // decay 1: the model takes the average as it stands (the end of a run).
    NoGradGuard no_grad;
    for (const Tensor& p : net.parameters()) p.detach().copy_(randn(p.shape()));
  }
  lookahead.update(1.0);
  const auto state = net.state_dict();
  for (const auto& [name, t] : lookahead.state_dict()) CHECK(max_abs_diff(t, state[name]) == 0.0);
  CHECK_THROWS_WITH_AS(lookahead.update(1.5), doctest::Contains("decay must be in [0, 1]"), Error);
}

TEST_CASE("lerp_ is torch's two-sided formula: weight 1 gives end exactly") {
  Tensor s = from_vector(std::vector<float>{1e8f, -3.0f}, {2}), e = from_vector(std::vector<float>{1.0f, 5.0f}, {2});
  optim::lerp_(s, e, 1.0);
  CHECK(s.tolist<float>() == std::vector<float>{1.0f, 5.0f});
  Tensor t = from_vector(std::vector<double>{2.0}, {1});
  optim::lerp_(t, from_vector(std::vector<double>{4.0}, {1}), 0.25);
  CHECK(t.item<double>() == 2.5);
}

TEST_CASE("alternating flip: epoch 0's coin, the whole set inverted on odd epochs; random flip redraws") {
  const int64_t n = 2000;
  int64_t flipped0 = 0, changed_random = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool e0 = data::flips_image(data::Flip::alternating, 7, 0, i);
    flipped0 += e0;
    CHECK(data::flips_image(data::Flip::alternating, 7, 1, i) == !e0);
    CHECK(data::flips_image(data::Flip::alternating, 7, 2, i) == e0);
    CHECK(data::flips_image(data::Flip::alternating, 7, 5, i) == !e0);
    CHECK_FALSE(data::flips_image(data::Flip::none, 7, 1, i));
    changed_random += data::flips_image(data::Flip::random, 7, 0, i) != data::flips_image(data::Flip::random, 7, 1, i);
  }
  CHECK(std::abs(flipped0 - n / 2) < 150);        // a fair coin: 1000 +- 3.4 sigma
  CHECK(std::abs(changed_random - n / 2) < 150);  // independent coins per epoch
}

TEST_CASE("gather_augmented equals pad(reflect) + crop + flip by tensor ops; the loader's rank slices tile its batch") {
  Tensor images = randn({6, 3, 8, 8});
  const std::vector<int64_t> indices = {4, 0, 5};
  const std::vector<uint8_t> flips = {1, 0, 1};
  const std::vector<std::pair<int64_t, int64_t>> shifts = {{-2, 1}, {2, 2}, {0, -1}};
  Tensor got = data::gather_augmented(images, indices, flips, shifts);
  Tensor got_nhwc = data::gather_augmented(images, indices, flips, shifts, MemoryFormat::ChannelsLast);
  CHECK(got_nhwc.is_contiguous(MemoryFormat::ChannelsLast));
  CHECK(max_abs_diff(got, got_nhwc) == 0.0);
  for (size_t b = 0; b < indices.size(); ++b) {
    Tensor image = images.narrow(0, indices[b], 1);
    if (flips[b]) image = flip(image, {3});
    Tensor padded = pad(image, {2, 2, 2, 2}, "reflect");
    Tensor expected = padded.narrow(2, 2 + shifts[b].first, 8).narrow(3, 2 + shifts[b].second, 8);
    CHECK(max_abs_diff(got.narrow(0, static_cast<int64_t>(b), 1), expected) == 0.0);
  }
  Tensor labels = arange(6);
  data::InMemoryLoader whole(images, labels, {.batch_size = 4, .shuffle = true, .drop_last = true,
                                              .flip = data::Flip::alternating, .translate = 2, .seed = 3});
  CHECK(whole.size() == 1);
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    data::Batch full = whole.epoch(epoch).batch(0);
    std::vector<Tensor> parts, targets;
    for (int64_t r = 0; r < 2; ++r) {
      data::InMemoryLoader half(images, labels, {.batch_size = 4, .shuffle = true, .drop_last = true,
                                                 .flip = data::Flip::alternating, .translate = 2, .seed = 3,
                                                 .rank = r, .world_size = 2});
      data::Batch b = half.epoch(epoch).batch(0);
      parts.push_back(b.data);
      targets.push_back(b.target);
    }
    CHECK(max_abs_diff(cat(parts, 0), full.data) == 0.0);
    CHECK(cat(targets, 0).tolist<int64_t>() == full.target.tolist<int64_t>());
  }
  CHECK_THROWS_WITH_AS(data::InMemoryLoader(images, labels, {.batch_size = 3, .rank = 0, .world_size = 2}),
                       doctest::Contains("divide evenly"), Error);
}

namespace {

// A "network" whose logits show which view it saw: the mean of the first row of channel 0
// in class 0, of its first column in class 1.
class ViewProbe : public nn::Cloneable<ViewProbe> {
 public:
  ViewProbe() : Cloneable("ViewProbe") {}
  void reset() override {}
  Tensor forward(const Tensor& x) override {
    Tensor row = mean(x.narrow(1, 0, 1).narrow(2, 0, 1), {1, 2, 3});
    Tensor col = mean(x.narrow(1, 0, 1).narrow(3, 0, 1), {1, 2, 3});
    return stack({row, col}, 1);
  }
};

}  // namespace

TEST_CASE("TTA weighs the unshifted mirror pair 1/2 and each shifted pair 1/4") {
  ViewProbe probe;
  Tensor x = randn({3, 1, 6, 6});
  auto m = [&](const Tensor& v) { return (probe.forward(v) + probe.forward(flip(v, {3}))) * 0.5; };
  Tensor padded = pad(x, {1, 1, 1, 1}, "reflect");
  Tensor expected = m(x) * 0.5 + m(padded.narrow(2, 0, 6).narrow(3, 0, 6)) * 0.25 +
                    m(padded.narrow(2, 2, 6).narrow(3, 2, 6)) * 0.25;
  CHECK(max_abs_diff(nn::tta_logits(probe, x, nn::TTA::mirror_translate), expected) < 1e-6);
  CHECK(max_abs_diff(nn::tta_logits(probe, x, nn::TTA::mirror), m(x)) < 1e-7);
  CHECK(max_abs_diff(nn::tta_logits(probe, x, nn::TTA::none), probe.forward(x)) == 0.0);
  const Tensor x_nhwc = x.contiguous(MemoryFormat::ChannelsLast);
  CHECK(max_abs_diff(nn::tta_logits(probe, x_nhwc, nn::TTA::mirror_translate), expected) < 1e-6);
  Tensor labels = argmax(nn::tta_logits(probe, x, nn::TTA::mirror_translate), 1);
  CHECK(nn::tta_accuracy(probe, x, labels, nn::TTA::mirror_translate, 2) == 1.0);
}

TEST_CASE("airbench94: the net's shapes and parameter count; 30 steps of the recipe lower the loss") {
  auto net = nn::airbench94();
  int64_t count = 0, frozen = 0;
  for (const Tensor& p : net->parameters()) {
    count += p.numel();
    if (!p.requires_grad()) frozen += p.numel();
  }
  CHECK(count == 1972792);
  CHECK(frozen == 64 + 64 + 256 + 256 + 256 + 256);  // the BatchNorm weights (the whitening weight is frozen later)
  CHECK(net->forward(randn({2, 3, 32, 32})).shape() == Shape{2, 10});
  CHECK_THROWS_WITH_AS(net->forward(randn({2, 3, 64, 64})), doctest::Contains("32x32"), Error);

  // A learnable stand-in for CIFAR-10 (the real files need not be here): each class is a
  // colour plus noise. Batch 256 of 2,560 images (10 steps an epoch), 30 steps.
  Generator gen(11);
  const int64_t n = 2560;
  Tensor labels = randint(0, 10, {n}, TensorOptions(kInt64), &gen);
  Tensor colours = randn({10, 3, 1, 1}, {}, &gen);
  Tensor images =
      (index_select(colours, 0, labels).expand({n, 3, 32, 32}) + randn({n, 3, 32, 32}, {}, &gen) * 1.5).contiguous();
  examples::Airbench94Config config;
  config.batch_size = 256;
  config.epochs = 3;
  config.whiten_images = 500;
  config.eval_batch_size = 512;
  config.memory_format = MemoryFormat::ChannelsLast;  // as examples/airbench runs it
  const examples::CifarTensors train{images, labels};
  const examples::CifarTensors test{images.narrow(0, 0, 512).contiguous(), labels.narrow(0, 0, 512).contiguous()};
  const auto result = examples::run_airbench94(config, train, test);
  CHECK(result.steps == 30);
  REQUIRE(result.per_epoch.size() == 3);
  MESSAGE("loss per epoch: ", result.per_epoch[0].train_loss, " ", result.per_epoch[1].train_loss, " ",
          result.per_epoch[2].train_loss, "; TTA accuracy ", result.tta_accuracy);
  CHECK(result.per_epoch[2].train_loss < 0.8 * result.per_epoch[0].train_loss);
  CHECK(result.tta_accuracy > 0.5);
  CHECK(result.wall_time_s > 0);

  // Note [Where the speedrun's memory goes]: the memory at the end of each phase.
  const int64_t image_bytes = 3 * 32 * 32 * 4;
  // The test set is a view of the training set's storages, counted once; the test images
  // relaid in channels-last are a copy of their own.
  CHECK(result.data_bytes == n * image_bytes + n * 8 + 512 * image_bytes);
  std::vector<std::string> phases;
  int64_t peak = 0;
  for (const examples::Airbench94Memory& m : result.memory) {
    CAPTURE(m.phase);
    phases.push_back(m.phase);
    CHECK(m.peak_resident >= std::max(peak, m.resident));  // the peak so far never falls
    peak = m.peak_resident;
    CHECK(m.allocated <= m.reserved);
    CHECK(m.peak_allocated <= m.peak_reserved);
    CHECK(m.peak_reserved >= m.reserved);
  }
  CHECK(phases == std::vector<std::string>{"data", "whitening", "first step", "training", "tta", "accuracy"});
  CHECK(peak > result.data_bytes);
}
