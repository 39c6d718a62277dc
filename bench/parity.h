// loom's half of the eval-parity programs (resnet_parity.cpp, vit_parity.cpp): evaluate a
// batch and write it with loom's answer for bench/parity.py, which evaluates the same batch
// in PyTorch from the same weights and compares.
//
//   model->eval();
//   const float loss = parity::save_eval_batch(*model, images, labels, out);   // <out>/batch.safetensors
#pragma once

#include <filesystem>
#include <string>

#include "autograd/grad_mode.h"  // defines: NoGradGuard
#include "autograd/ops.h"        // defines: cross_entropy
#include "nn/module.h"           // defines: Module
#include "nn/safetensors.h"      // defines: safetensors::save_file

namespace loom::parity {

// Runs model(images) without gradients and writes "images", "labels", loom's "logits" and its
// cross-entropy "loss" to <out>/batch.safetensors (creating <out>); returns the loss.
inline float save_eval_batch(nn::Module& model, const Tensor& images, const Tensor& labels, const std::string& out) {
  NoGradGuard no_grad;
  Tensor logits = model(images);
  Tensor loss = cross_entropy(logits, labels);
  std::filesystem::create_directories(out);
  OrderedDict<Tensor> batch;
  batch.insert("images", images);
  batch.insert("labels", labels);
  batch.insert("logits", logits);
  batch.insert("loss", loss.reshape({1}));
  safetensors::save_file(batch, out + "/batch.safetensors");
  return loss.item<float>();
}

}  // namespace loom::parity
