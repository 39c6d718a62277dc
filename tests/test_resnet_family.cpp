// torchvision's ResNet family (nn/resnet.h, nn/resnet_blocks.h): parameter counts equal to
// torchvision's, its state_dict keys and shapes, Bottleneck's gradients by finite
// differences, and a Bottleneck as one unit of FSDP and one layer of sequential().
//
// Parity of values with PyTorch (resnet50 from the same weights) is
// bench/resnet_parity_torch.py: it needs torch, which this suite must not.
#include <doctest/doctest.h>

#include <functional>
#include <string>

#include "gradcheck.h"                                  // defines: gradcheck, leaf
#include "nn/nn.h"                                      // defines: resnet18 ... wide_resnet50_2, Bottleneck
#include "parallel/fsdp/fully_sharded_data_parallel.h"  // defines: FullyShardedDataParallel
#include "parallel/fsdp/state_dict.h"                   // defines: full_state_dict
#include "rank_threads.h"                               // defines: run_ranks, max_abs_diff

using namespace loom;

namespace {

int64_t count(const std::vector<Tensor>& tensors) {
  int64_t n = 0;
  for (const Tensor& t : tensors) n += t.numel();
  return n;
}

struct Family {
  const char* name;
  std::function<std::shared_ptr<nn::ResNet>(int64_t, nn::ResNetStem)> make;
  int64_t torchvision_parameters;  // torchvision.models.<name>(): ImageNet stem, 1000 classes
  size_t parameter_tensors;
};

// Parameter totals and len(list(model.parameters())) of torchvision 0.14's models.
const std::vector<Family>& family() {
  static const std::vector<Family> models = {
      {"resnet18", nn::resnet18, 11'689'512, 62},      {"resnet34", nn::resnet34, 21'797'672, 110},
      {"resnet50", nn::resnet50, 25'557'032, 161},     {"resnet101", nn::resnet101, 44'549'160, 314},
      {"resnet152", nn::resnet152, 60'192'808, 467},   {"wide_resnet50_2", nn::wide_resnet50_2, 68'883'240, 161},
      {"wide_resnet101_2", nn::wide_resnet101_2, 126'886'696, 314},
  };
  return models;
}

}  // namespace

TEST_CASE("every model has torchvision's parameter count (ImageNet stem, 1000 classes); the CIFAR stem differs in conv1 only") {
  nn::init::NoInitGuard no_init;  // counting only: skip the random initialisation
  for (const Family& f : family()) {
    const std::string name = f.name;
    CAPTURE(name);
    auto imagenet = f.make(1000, nn::ResNetStem::imagenet);
    const int64_t n = count(imagenet->parameters());
    MESSAGE(name, " (ImageNet stem, 1000 classes): ", n, " parameters");
    CHECK(n == f.torchvision_parameters);
    CHECK(imagenet->parameters().size() == f.parameter_tensors);
    imagenet.reset();
    // CIFAR stem, 10 classes: conv1 is 3x3 (3 * 64 * 40 fewer weights) and fc has 990 fewer
    // rows of num_features() weights and a bias.
    auto cifar = f.make(10, nn::ResNetStem::cifar);
    const int64_t fc_rows = 990 * (cifar->num_features() + 1);
    CHECK(count(cifar->parameters()) == f.torchvision_parameters - 3 * 64 * 40 - fc_rows);
  }
  // The figure nn/resnet.h and test_resnet quote for the default resnet18.
  CHECK(count(nn::resnet18(10)->parameters()) == 11'173'962);
}

TEST_CASE("resnet50's state_dict: torchvision's 320 keys, in its order, with its shapes") {
  nn::init::NoInitGuard no_init;
  auto model = nn::resnet50(1000, nn::ResNetStem::imagenet);
  auto sd = model->state_dict();
  // 53 convs (1 stem + 16 blocks x 3 + 4 downsamples), 53 BatchNorms x (2 parameters + 3
  // buffers), fc's weight and bias.
  CHECK(sd.size() == 53 + 53 * 5 + 2);
  const auto keys = sd.keys();
  std::vector<std::string> first(keys.begin(), keys.begin() + 26);
  CHECK(first == std::vector<std::string>{
                     "conv1.weight", "bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var",
                     "bn1.num_batches_tracked", "layer1.0.conv1.weight", "layer1.0.bn1.weight", "layer1.0.bn1.bias",
                     "layer1.0.bn1.running_mean", "layer1.0.bn1.running_var", "layer1.0.bn1.num_batches_tracked",
                     "layer1.0.conv2.weight", "layer1.0.bn2.weight", "layer1.0.bn2.bias", "layer1.0.bn2.running_mean",
                     "layer1.0.bn2.running_var", "layer1.0.bn2.num_batches_tracked", "layer1.0.conv3.weight",
                     "layer1.0.bn3.weight", "layer1.0.bn3.bias", "layer1.0.bn3.running_mean",
                     "layer1.0.bn3.running_var", "layer1.0.bn3.num_batches_tracked", "layer1.0.downsample.0.weight",
                     "layer1.0.downsample.1.weight"});
  CHECK(keys.back() == "fc.bias");
  CHECK(sd["conv1.weight"].shape() == Shape{64, 3, 7, 7});
  // layer1 widens 64 -> 256 channels, so its first block has a (stride-1) projection.
  CHECK(sd["layer1.0.downsample.0.weight"].shape() == Shape{256, 64, 1, 1});
  CHECK_FALSE(sd.contains("layer1.1.downsample.0.weight"));
  CHECK(sd["layer2.0.conv1.weight"].shape() == Shape{128, 256, 1, 1});
  CHECK(sd["layer2.0.conv2.weight"].shape() == Shape{128, 128, 3, 3});
  CHECK(sd["layer2.0.conv3.weight"].shape() == Shape{512, 128, 1, 1});
  CHECK(sd["layer3.5.bn3.running_var"].shape() == Shape{1024});
  CHECK(sd["layer4.2.conv3.weight"].shape() == Shape{2048, 512, 1, 1});
  CHECK(sd["fc.weight"].shape() == Shape{1000, 2048});
  // Note [Bottleneck strides on the 3x3]: V1.5's stride is on conv2.
  auto block = model->layer2->at<nn::Bottleneck>(0);
  CHECK(block->conv1->stride == nn::Pair(1));
  CHECK(block->conv2->stride == nn::Pair(2));
  CHECK(block->downsample->at<nn::Conv2d>(0)->stride == nn::Pair(2));
  CHECK(model->maxpool != nullptr);
  CHECK(nn::resnet50()->maxpool == nullptr);  // the CIFAR stem (the default) has none
}

TEST_CASE("wide_resnet50_2 doubles the inner width of each Bottleneck, not its output") {
  nn::init::NoInitGuard no_init;
  auto sd = nn::wide_resnet50_2(1000, nn::ResNetStem::imagenet)->state_dict();
  CHECK(sd["layer1.0.conv1.weight"].shape() == Shape{128, 64, 1, 1});
  CHECK(sd["layer1.0.conv2.weight"].shape() == Shape{128, 128, 3, 3});
  CHECK(sd["layer1.0.conv3.weight"].shape() == Shape{256, 128, 1, 1});
  CHECK(sd["layer4.0.conv2.weight"].shape() == Shape{1024, 1024, 3, 3});
  CHECK(sd["fc.weight"].shape() == Shape{1000, 2048});
}

TEST_CASE("forward shapes: the ImageNet stem divides by 32, the CIFAR stem by 8") {
  auto small = std::make_shared<nn::ResNet>(std::vector<int64_t>{1, 1, 1, 1}, std::vector<int64_t>{4, 4, 8, 8}, 7,
                                            nn::ResNetOptions{.block = nn::ResNetBlock::bottleneck,
                                                              .stem = nn::ResNetStem::imagenet});
  CHECK(small->num_features() == 32);
  CHECK(small->forward(randn({2, 3, 64, 64})).shape() == Shape{2, 7});
  auto cifar = std::make_shared<nn::ResNet>(std::vector<int64_t>{1, 1, 1, 1}, std::vector<int64_t>{4, 4, 8, 8}, 7,
                                            nn::ResNetOptions{.block = nn::ResNetBlock::bottleneck});
  CHECK(cifar->forward(randn({2, 3, 8, 8})).shape() == Shape{2, 7});
  nn::Bottleneck block(16, 8, 2);
  CHECK(block.forward(randn({1, 16, 6, 6})).shape() == Shape{1, 32, 3, 3});
}

TEST_CASE("bad arguments name what was expected") {
  CHECK_THROWS_WITH_AS(std::make_shared<nn::ResNet>(std::vector<int64_t>{2, 2, 2, 2}, std::vector<int64_t>{64, 128, 256, 512},
                                                    10, nn::ResNetOptions{.width_per_group = 128}),
                       doctest::Contains("BasicBlock only supports width_per_group=64, got 128"), Error);
  CHECK_THROWS_WITH_AS(nn::Bottleneck(8, 0), doctest::Contains("expected positive in_planes, planes and stride"), Error);
  CHECK_THROWS_WITH_AS(nn::Bottleneck(8, 1, 1, 32), doctest::Contains("must be at least 1 channel"), Error);
}

TEST_CASE("Bottleneck gradients by finite differences (float64, training-mode BatchNorm, projection shortcut)") {
  manual_seed(5);
  auto block = std::make_shared<nn::Bottleneck>(/*in_planes=*/3, /*planes=*/2, /*stride=*/2);
  block->to(kFloat64);
  REQUIRE(block->downsample);
  Tensor x = testing::leaf({2, 3, 4, 4}, 28);
  testing::gradcheck([&](const auto& in) { return (*block)(in[0]); }, {x}, 1e-6, 1e-5, 1e-3);
  testing::gradcheck([&](const auto& in) { return (*block)(in[0]); },
                     {x.detach(), block->conv1->weight, block->conv2->weight, block->conv3->weight, block->bn3->weight,
                      block->bn1->bias, block->downsample->at<nn::Conv2d>(0)->weight},
                     1e-6, 1e-5, 1e-3);
  // The identity shortcut, and a wide block (width = 2 * planes).
  auto identity = std::make_shared<nn::Bottleneck>(8, 2, 1, /*base_width=*/128);
  identity->to(kFloat64);
  CHECK(identity->width == 4);
  CHECK_FALSE(identity->downsample);
  Tensor y = testing::leaf({2, 8, 3, 3}, 29);
  testing::gradcheck([&](const auto& in) { return (*identity)(in[0]); }, {y, identity->conv2->weight}, 1e-6, 1e-5, 1e-3);
}

TEST_CASE("sequential(): the ImageNet stem adds maxpool; each Bottleneck is one layer; the same forward") {
  auto model = std::make_shared<nn::ResNet>(std::vector<int64_t>{2, 1, 1, 1}, std::vector<int64_t>{4, 4, 8, 8}, 10,
                                            nn::ResNetOptions{.block = nn::ResNetBlock::bottleneck,
                                                              .stem = nn::ResNetStem::imagenet});
  model->eval();
  auto seq = model->sequential();
  REQUIRE(seq->size() == 4 + 5 + 3);  // conv1 bn1 relu maxpool, 5 blocks, avgpool flatten fc
  CHECK((*seq)[3]->type_name() == "MaxPool2d");
  for (size_t i = 4; i < 9; ++i) CHECK((*seq)[i]->type_name() == "Bottleneck");
  Tensor x = randn({2, 3, 32, 32});
  CHECK(seq->forward(x).tolist<float>() == model->forward(x).tolist<float>());
}

TEST_CASE("FSDP: each Bottleneck is a unit; FULL_SHARD on 2 ranks takes the single-device step (float64)") {
  manual_seed(6);
  auto start = std::make_shared<nn::ResNet>(std::vector<int64_t>{1, 1, 1, 1}, std::vector<int64_t>{2, 2, 4, 4}, 5,
                                            nn::ResNetOptions{.block = nn::ResNetBlock::bottleneck,
                                                              .stem = nn::ResNetStem::imagenet});
  start->to(kFloat64);
  start->eval();  // BatchNorm from running statistics: no batch statistics to differ per rank
  Tensor images = randn({4, 3, 16, 16}).to(kFloat64), labels = randint(0, 5, {4});

  auto single = start->clone();
  single->eval();
  optim::SGD single_opt(single->parameters(), {.lr = 0.1});
  cross_entropy((*single)(images), labels).backward();
  single_opt.step();
  const auto expected = single->state_dict();

  std::vector<std::string> unit_names;
  std::vector<OrderedDict<Tensor>> states(2);
  testing::require_no_errors(testing::run_ranks(2, [&](std::shared_ptr<distributed::Communicator> comm) {
    const int rank = comm->rank();
    fsdp::FullyShardedDataParallel model(start->clone(), comm);
    model.eval();
    if (rank == 0)
      for (const auto& unit : model.units()) unit_names.push_back(unit.name);
    optim::SGD opt(model.parameters(), {.lr = 0.1});
    cross_entropy(model(images.narrow(0, 2 * rank, 2)), labels.narrow(0, 2 * rank, 2)).backward();
    opt.step();
    states[static_cast<size_t>(rank)] = fsdp::full_state_dict(model, /*rank0_only=*/false);
  }));
  CHECK(unit_names == std::vector<std::string>{"stem", "Bottleneck 4", "Bottleneck 5", "Bottleneck 6",
                                               "Bottleneck 7", "head"});
  for (size_t r = 0; r < 2; ++r) {
    double diff = 0;
    for (const auto& key : expected.keys())
      if (is_floating(expected[key].dtype())) diff = std::max(diff, testing::max_abs_diff(states[r][key], expected[key]));
    MESSAGE("rank ", r, ": max |FSDP - single device| = ", diff);
    CHECK(diff < 1e-12);
  }
}

TEST_CASE("make_model: every family member by its torchvision name; an unknown name lists the known ones") {
  nn::init::NoInitGuard no_init;
  auto model = std::dynamic_pointer_cast<nn::ResNet>(nn::make_model("resnet50"));
  REQUIRE(model != nullptr);
  CHECK(model->options.block == nn::ResNetBlock::bottleneck);
  CHECK(model->maxpool == nullptr);  // the CIFAR stem by default
  CHECK(model->num_classes == 10);
  auto imagenet = std::dynamic_pointer_cast<nn::ResNet>(
      nn::make_model("wide_resnet50_2", {.num_classes = 1000, .stem = nn::ResNetStem::imagenet}));
  CHECK(count(imagenet->parameters()) == 68'883'240);
  CHECK(count(nn::make_model("tiny")->parameters()) == 78'002);
  for (const Family& f : family()) CHECK(nn::make_model(f.name) != nullptr);
  CHECK_THROWS_WITH_AS(nn::make_model("resnet51"),
                       doctest::Contains("unknown model 'resnet51': expected one of resnet18, resnet34, resnet50, "
                                         "resnet101, resnet152, wide_resnet50_2, wide_resnet101_2, resnet_tiny, "
                                         "tiny"),
                       Error);
  CHECK_THROWS_WITH_AS(nn::make_model("resnet18", {.num_classes = 0}), doctest::Contains("num_classes must be positive"),
                       Error);
}
