// vit_parity: loom's side of the check that a Vision Transformer computes what PyTorch
// computes from the same weights. bench/vit_parity_torch.py runs it and compares.
//
//   build/bench/vit_parity --model vit_tiny --out /tmp/vit_parity
//
// It builds the model, moves its LayerNorms and biases away from their initial 1s and 0s
// (so that evaluation exercises every term), and writes
//   <out>/model.safetensors   the state_dict with PyTorch's attention keys: q, k and v
//                             packed into self_attn.in_proj_weight / in_proj_bias
//                             (nn::mha_state_dict_to_pytorch), everything else as is
//   <out>/batch.safetensors   "images", "labels", and loom's eval-mode "logits" and "loss"
// The script loads both into a torch.nn model built from nn.TransformerEncoderLayer.
#include <cstdio>
#include <string>

#include "autograd/grad_mode.h"      // defines: NoGradGuard
#include "autograd/ops.h"            // defines: rand, randn, randint
#include "bench/parity.h"            // defines: parity::save_eval_batch
#include "nn/multihead_attention.h"  // defines: mha_state_dict_to_pytorch
#include "nn/safetensors.h"          // defines: safetensors::save_file
#include "nn/vision_transformer.h"   // defines: vit_tiny, vit_small

using namespace loom;

int main(int argc, char** argv) {
  std::string model_name = "vit_tiny", out = "/tmp/vit_parity";
  int64_t batch = 16;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--model") model_name = value;
    else if (flag == "--out") out = value;
    else if (flag == "--batch") batch = std::stoll(value);
    else {
      std::fprintf(stderr, "vit_parity: unknown flag %s (expected --model --out --batch)\n", flag.c_str());
      return 2;
    }
  }
  LOOM_CHECK(model_name == "vit_tiny" || model_name == "vit_small", "--model: expected vit_tiny or vit_small, got '",
             model_name, "'");
  manual_seed(0);
  auto model = model_name == "vit_tiny" ? nn::vit_tiny(10) : nn::vit_small(10);
  {
    NoGradGuard no_grad;
    for (const auto& [name, p] : model->named_parameters()) {
      const bool norm = name.find("norm") != std::string::npos;
      if (norm && name.ends_with("weight")) p.detach().copy_(rand(p.shape()) + 0.5);
      else if (name.ends_with("bias")) p.detach().copy_(randn(p.shape()) * 0.05);
    }
  }
  model->eval();
  Tensor images = randn({batch, 3, 32, 32}), labels = randint(0, 10, {batch});
  const float loss = parity::save_eval_batch(*model, images, labels, out);
  safetensors::save_file(nn::mha_state_dict_to_pytorch(model->state_dict()), out + "/model.safetensors",
                         {{"format", "pt"}});
  std::printf("loom %s: eval loss %.9g on %lld random images\n", model_name.c_str(), loss,
              static_cast<long long>(batch));
  return 0;
}
