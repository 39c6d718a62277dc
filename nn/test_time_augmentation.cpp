#include "nn/test_time_augmentation.h"

#include "autograd/grad_mode.h"
#include "autograd/ops.h"  // defines: flip, pad, narrow, argmax, eq, sum

namespace loom::nn {

namespace {

// The views keep the images' layout (flip and pad make NCHW copies), so a channels-last
// model sees channels-last input for every view.
MemoryFormat layout_of(const Tensor& x) {
  return x.dim() == 4 && !x.is_contiguous() && x.is_contiguous(MemoryFormat::ChannelsLast) ? MemoryFormat::ChannelsLast
                                                                                          : MemoryFormat::Contiguous;
}

// Each view goes through model(x), not model.forward(x): a wrapped model (FSDP's gathers, a
// tensor-parallel layer's hooks) does its work in hooks (Note [Forward hooks run in module(x)]).
Tensor mirror_mean(Module& model, const Tensor& x) {
  return (model(x) + model(flip(x, {3}).contiguous(layout_of(x)))) * 0.5;
}

}  // namespace

Tensor tta_logits(Module& model, const Tensor& images, TTA level) {
  LOOM_CHECK(images.defined() && images.dim() == 4, "tta_logits: expected images [N, C, H, W], got ",
             images.defined() ? detail::str(images.shape()) : std::string("an undefined tensor"));
  NoGradGuard no_grad;
  switch (level) {
    case TTA::none:
      return model(images);
    case TTA::mirror:
      return mirror_mean(model, images);
    case TTA::mirror_translate: {  // See Note [TTA weights]
      const int64_t h = images.size(2), w = images.size(3);
      const Tensor padded = pad(images, {1, 1, 1, 1}, "reflect");
      const Tensor up_left = padded.narrow(2, 0, h).narrow(3, 0, w).contiguous(layout_of(images));
      const Tensor down_right = padded.narrow(2, 2, h).narrow(3, 2, w).contiguous(layout_of(images));
      const Tensor centre = mirror_mean(model, images);
      const Tensor shifted = (mirror_mean(model, up_left) + mirror_mean(model, down_right)) * 0.5;
      return centre * 0.5 + shifted * 0.5;
    }
  }
  LOOM_FAIL("tta_logits: unknown TTA level ", static_cast<int>(level));
}

double tta_accuracy(Module& model, const Tensor& images, const Tensor& labels, TTA level, int64_t batch_size) {
  LOOM_CHECK(images.defined() && labels.defined() && images.dim() == 4 && labels.dim() == 1 &&
                 labels.size(0) == images.size(0),
             "tta_accuracy: expected images [N, C, H, W] and labels [N]");
  LOOM_CHECK(batch_size > 0, "tta_accuracy: batch_size must be positive, got ", batch_size);
  NoGradGuard no_grad;
  const auto parameters = model.parameters();
  const Device device = parameters.empty() ? images.device() : parameters.front().device();
  const int64_t n = images.size(0);
  int64_t correct = 0;
  for (int64_t start = 0; start < n; start += batch_size) {
    const int64_t len = std::min(batch_size, n - start);
    const Tensor logits = tta_logits(model, images.narrow(0, start, len).to(device), level);
    const Tensor predicted = argmax(logits, 1).to(Device("cpu"));
    correct += sum(eq(predicted, labels.narrow(0, start, len).to(kInt64))).to(kInt64).item<int64_t>();
  }
  return n == 0 ? 0.0 : static_cast<double>(correct) / static_cast<double>(n);
}

}  // namespace loom::nn
