// resnet_parity: loom's side of the check that a ResNet computes what PyTorch computes
// from the same weights. bench/resnet_parity_torch.py runs it and compares.
//
//   build/bench/resnet_parity --model resnet50 --stem imagenet --out /tmp/parity
//
// It builds the model, gives its BatchNorms statistics and affine values that are not the
// initial 0/1 (a few training-mode forwards on random images, then random weights and
// biases), so that evaluation exercises every term of BatchNorm, and writes
//   <out>/model.safetensors   the state_dict, torchvision's keys (nn::save)
//   <out>/batch.safetensors   "images", "labels", and loom's eval-mode "logits" and "loss"
// The script loads both into a torch.nn model with torchvision's names and compares.
#include <cstdio>
#include <string>

#include "autograd/grad_mode.h"  // defines: NoGradGuard
#include "autograd/ops.h"        // defines: rand, randn, randint
#include "bench/parity.h"         // defines: parity::save_eval_batch
#include "nn/batchnorm.h"        // defines: BatchNorm2d
#include "nn/models.h"           // defines: make_model
#include "nn/safetensors.h"      // defines: nn::save

using namespace loom;

int main(int argc, char** argv) {
  std::string model_name = "resnet50", stem_name = "imagenet", out = "/tmp/resnet_parity";
  int64_t batch = 4, size = 224, classes = 1000;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--model") model_name = value;
    else if (flag == "--stem") stem_name = value;
    else if (flag == "--out") out = value;
    else if (flag == "--batch") batch = std::stoll(value);
    else if (flag == "--size") size = std::stoll(value);
    else if (flag == "--classes") classes = std::stoll(value);
    else {
      std::fprintf(stderr, "resnet_parity: unknown flag %s (expected --model --stem --out --batch --size --classes)\n",
                   flag.c_str());
      return 2;
    }
  }
  LOOM_CHECK(stem_name == "imagenet" || stem_name == "cifar", "--stem: expected imagenet or cifar, got '", stem_name, "'");
  manual_seed(0);
  auto model = nn::make_model(model_name, {.num_classes = classes,
                                           .stem = stem_name == "imagenet" ? nn::ResNetStem::imagenet
                                                                           : nn::ResNetStem::cifar});
  {
    NoGradGuard no_grad;
    model->train();
    for (int i = 0; i < 3; ++i) (*model)(randn({batch, 3, size, size}));
    for (const auto& m : model->modules())
      if (auto* bn = dynamic_cast<nn::BatchNorm2d*>(m.get())) {
        bn->weight.copy_(rand(bn->weight.shape()) + 0.5);
        bn->bias.copy_(randn(bn->bias.shape()) * 0.1);
      }
  }
  model->eval();
  Tensor images = randn({batch, 3, size, size}), labels = randint(0, classes, {batch});
  const float loss = parity::save_eval_batch(*model, images, labels, out);
  nn::save(*model, out + "/model.safetensors");
  std::printf("loom %s (%s stem): eval loss %.9g on %lld images of %lldx%lld\n", model_name.c_str(), stem_name.c_str(),
              loss, static_cast<long long>(batch), static_cast<long long>(size), static_cast<long long>(size));
  return 0;
}
