// ResNet: the CIFAR resnet18's size and torchvision names, forward shapes, gradients
// through resnet_tiny, clone equivalence, and a few SGD steps lowering the loss.
#include <doctest/doctest.h>

#include "gradcheck.h"
#include "nn/nn.h"

using namespace loom;

namespace {

// Built once: resnet18's 11M-parameter initialisation is the slow part of these tests.
nn::ResNet& shared_resnet18() {
  static std::shared_ptr<nn::ResNet> model = nn::resnet18(10);
  return *model;
}

int64_t count(const std::vector<Tensor>& tensors) {
  int64_t n = 0;
  for (const Tensor& t : tensors) n += t.numel();
  return n;
}

}  // namespace

TEST_CASE("resnet18 (CIFAR) has 11,173,962 parameters and torchvision's 122 state_dict entries") {
  nn::ResNet* model = &shared_resnet18();
  CHECK(count(model->parameters()) == 11'173'962);
  // 20 convs (1 stem + 16 in blocks + 3 downsample) + 20 BNs x 2 + fc x 2 = 62 parameters;
  // 20 BNs x 3 buffers = 60; see nn/resnet.h.
  CHECK(model->parameters().size() == 62);
  CHECK(model->buffers().size() == 60);
  auto sd = model->state_dict();
  CHECK(sd.size() == 122);
  CHECK(sd.items().front().first == "conv1.weight");
  CHECK(sd.items().back().first == "fc.bias");
  CHECK(sd["conv1.weight"].shape() == Shape{64, 3, 3, 3});
  CHECK(sd["bn1.running_mean"].shape() == Shape{64});
  CHECK(sd["bn1.num_batches_tracked"].dtype() == kInt64);
  CHECK(sd["layer1.0.conv1.weight"].shape() == Shape{64, 64, 3, 3});
  CHECK(sd["layer2.0.conv1.weight"].shape() == Shape{128, 64, 3, 3});
  CHECK(sd["layer2.0.downsample.0.weight"].shape() == Shape{128, 64, 1, 1});
  CHECK(sd["layer2.0.downsample.1.running_var"].shape() == Shape{128});
  CHECK(sd["layer4.1.bn2.bias"].shape() == Shape{512});
  CHECK(sd["fc.weight"].shape() == Shape{10, 512});
  CHECK(sd["fc.bias"].shape() == Shape{10});
  CHECK_FALSE(sd.contains("layer1.0.downsample.0.weight"));  // same shape: identity shortcut
  CHECK_FALSE(sd.contains("layer2.1.downsample.0.weight"));
  // The first keys in torchvision's order.
  const auto keys = sd.keys();
  std::vector<std::string> first(keys.begin(), keys.begin() + 8);
  CHECK(first == std::vector<std::string>{"conv1.weight", "bn1.weight", "bn1.bias", "bn1.running_mean",
                                          "bn1.running_var", "bn1.num_batches_tracked", "layer1.0.conv1.weight",
                                          "layer1.0.bn1.weight"});
  // Only fc depends on num_classes.
  CHECK(count(nn::resnet_tiny(100, 8)->parameters()) == count(nn::resnet_tiny(10, 8)->parameters()) + 90 * 64 + 90);
}

TEST_CASE("resnet18 maps [2, 3, 32, 32] images to [2, 10] logits") {
  nn::ResNet* model = &shared_resnet18();
  Tensor y = model->forward(randn({2, 3, 32, 32}));
  CHECK(y.shape() == Shape{2, 10});
  CHECK_THROWS_WITH_AS(model->forward(zeros({2, 1, 32, 32})), doctest::Contains("[N, 3, H, W]"), Error);
}

TEST_CASE("resnet_tiny has resnet18's names and one block per stage") {
  auto tiny = nn::resnet_tiny(10, 8);
  // 1 stem conv + 4 x 2 block convs + 3 downsamples = 12 convs, 12 BNs, fc.
  CHECK(tiny->state_dict().size() == 12 + 12 * 5 + 2);
  CHECK(count(tiny->parameters()) == 78'002);  // the figure nn/resnet.h quotes
  CHECK(tiny->state_dict().contains("layer3.0.downsample.1.running_mean"));
  CHECK_FALSE(tiny->state_dict().contains("layer1.1.conv1.weight"));
  CHECK(tiny->forward(randn({3, 3, 16, 16})).shape() == Shape{3, 10});
}

TEST_CASE("resnet_tiny gradients by finite differences (input, float64, training-mode BatchNorm)") {
  auto tiny = nn::resnet_tiny(3, 2);
  tiny->to(kFloat64);
  Tensor x = testing::leaf({2, 3, 4, 4}, 21);
  testing::gradcheck([&](const auto& in) { return tiny->forward(in[0]); }, {x}, 1e-6, 1e-5, 1e-3);
  // Parameters too, for the stem and the classifier.
  testing::gradcheck([&](const auto& in) { return tiny->forward(in[0]); },
                     {x.detach(), tiny->conv1->weight, tiny->fc->weight, tiny->layer2->at<nn::BasicBlock>(0)->bn1->bias},
                     1e-6, 1e-5, 1e-3);
}

TEST_CASE("a clone computes exactly what the original computes") {
  auto model = nn::resnet_tiny(10, 4);
  Tensor x = randn({2, 3, 8, 8});
  model->forward(x);  // move the running stats away from their initial values
  model->eval();
  auto copy = model->clone();
  CHECK(copy->forward(x).tolist<float>() == model->forward(x).tolist<float>());
  CHECK(dynamic_cast<nn::ResNet*>(copy.get())->layer2->at<nn::BasicBlock>(0)->downsample);
}

TEST_CASE("sequential() is the same forward over the same parameters, ready to cut into stages") {
  auto model = nn::resnet_tiny(10, 4);
  model->eval();
  auto seq = model->sequential();
  CHECK(seq->size() == 3 + 4 + 3);  // stem, one block per stage, avgpool + flatten + fc
  CHECK_FALSE(seq->is_training());
  CHECK(seq->parameters().size() == model->parameters().size());
  CHECK(seq->at<nn::Linear>(9)->weight.is_same(model->fc->weight));
  Tensor x = randn({2, 3, 8, 8});
  CHECK(seq->forward(x).tolist<float>() == model->forward(x).tolist<float>());
}

TEST_CASE("a few SGD steps on a fixed batch lower the cross-entropy") {
  manual_seed(3);
  auto model = nn::resnet_tiny(10, 8);
  optim::SGD opt(model->parameters(), {.lr = 0.05, .momentum = 0.9});
  nn::CrossEntropyLoss criterion;
  Tensor x = randn({8, 3, 8, 8});
  Tensor y = randint(0, 10, {8});
  double first = 0, last = 0;
  for (int step = 0; step < 6; ++step) {
    opt.zero_grad();
    Tensor loss = criterion(model->forward(x), y);
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item<float>();
  }
  CHECK(last < first);
}
