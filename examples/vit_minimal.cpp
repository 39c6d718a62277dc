// vit_minimal: a Vision Transformer trained on CIFAR-10 in one process, the recipe a
// transformer wants beside what a ResNet does with SGD: AdamW without weight decay on
// biases, norms and positions, a linear warm-up into a cosine schedule, and gradient
// clipping (docs/transformer.md). Each line of the PyTorch program it mirrors is above its
// C++; `model` is timm's vit_tiny_patch4_32 shape, nn::vit_tiny here.
//   build/examples/vit_minimal [--max-steps N --synthetic]
#include <cstdio>

#include "autograd/grad_mode.h"     // defines: NoGradGuard
#include "data/dataloader.h"        // defines: DataLoader
#include "examples/minimal.h"       // defines: --max-steps N, --synthetic, cifar10_train_set
#include "nn/loss.h"                // defines: CrossEntropyLoss
#include "nn/optim/adamw.h"         // defines: AdamW, param_groups_weight_decay
#include "nn/optim/clip_grad.h"     // defines: clip_grad_norm_
#include "nn/optim/lr_scheduler.h"  // defines: LinearLR, CosineAnnealingLR, SequentialLR
#include "nn/vision_transformer.h"  // defines: vit_tiny

using namespace loom;

int main(int argc, char** argv) try {
  const auto flags = examples::parse_minimal_flags(argc, argv);
  const int64_t epochs = 3, warmup_epochs = 1;
  // model = VisionTransformer(img_size=32, patch_size=4, embed_dim=192, depth=12, num_heads=3, num_classes=10)
  auto model = nn::vit_tiny(10);
  // dataset = torchvision.datasets.CIFAR10(root="./data", train=True, transform=transform)
  auto dataset = examples::cifar10_train_set(flags);
  // loader = DataLoader(dataset, batch_size=128, shuffle=True, num_workers=2)
  data::DataLoader loader(dataset, {.batch_size = 128, .shuffle = true, .num_workers = 2});
  // groups = timm.optim.param_groups_weight_decay(model, 0.05, model.no_weight_decay())
  auto groups = optim::param_groups_weight_decay(*model, 0.05, model->no_weight_decay());
  // optimizer = torch.optim.AdamW(groups, lr=1e-3, weight_decay=0.05)
  optim::AdamW optimizer(groups, {.lr = 1e-3, .weight_decay = 0.05});
  // warmup = LinearLR(optimizer, start_factor=0.1, total_iters=warmup_epochs)
  // cosine = CosineAnnealingLR(optimizer, T_max=epochs - warmup_epochs)
  // scheduler = SequentialLR(optimizer, [warmup, cosine], milestones=[warmup_epochs])
  auto warmup = std::make_shared<optim::LinearLR>(optimizer, 0.1, 1.0, warmup_epochs);
  auto cosine = std::make_shared<optim::CosineAnnealingLR>(optimizer, epochs - warmup_epochs);
  optim::SequentialLR scheduler(optimizer, {warmup, cosine}, {warmup_epochs});
  // criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
  nn::CrossEntropyLoss criterion(Tensor(), Reduction::Mean, -100, 0.1);
  int64_t step = 0;  // for --max-steps
  // for epoch in range(epochs):
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    Tensor loss;
    //   for images, labels in loader:
    for (data::Batch& batch : loader) {
      if (!flags.runs(step++)) break;
      //     loss = criterion(model(images), labels)
      loss = criterion((*model)(batch.data), batch.target);
      //     optimizer.zero_grad(); loss.backward()
      optimizer.zero_grad();
      loss.backward();
      //     torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
      nn::utils::clip_grad_norm_(model->parameters(), 1.0);
      //     optimizer.step()
      optimizer.step();
    }
    //   scheduler.step()
    scheduler.step();
    //   print(f"epoch {epoch + 1} loss {loss.item():.4f}")
    if (loss.defined()) std::printf("epoch %lld loss %.4f\n", static_cast<long long>(epoch + 1), loss.item<float>());
  }
  return 0;
} catch (const std::exception& e) {  // any error, loom::Error or not: one line, exit status 1
  std::fprintf(stderr, "vit_minimal: error: %s\n", e.what());
  return 1;
}
