#include "data/in_memory_loader.h"

#include "core/factory.h"     // defines: from_vector
#include "data/sample_rng.h"  // defines: SampleRng, AugmentSeed (Note [Per-sample randomness])
#include "data/sampler.h"     // defines: random_permutation, num_batches

namespace loom::data {

namespace {

// Mirror about the edges without repeating them (F.pad's "reflect"); |i| < size.
inline int64_t reflect(int64_t i, int64_t size) {
  if (i < 0) return -i;
  if (i >= size) return 2 * (size - 1) - i;
  return i;
}

}  // namespace

bool flips_image(Flip flip, uint64_t seed, int64_t epoch, int64_t index) {
  switch (flip) {
    case Flip::none:
      return false;
    case Flip::random:
      return SampleRng({seed, epoch}, index).uniform() < 0.5;
    case Flip::alternating:  // See Note [Alternating flip] (data/sample_rng.h)
      return alternating_flip(seed, epoch, index);
  }
  return false;
}

std::pair<int64_t, int64_t> translation(int64_t translate, uint64_t seed, int64_t epoch, int64_t index) {
  if (translate == 0) return {0, 0};
  // A stream of its own (seed + 1), so the shifts do not depend on the flip rule.
  SampleRng rng({seed + 1, epoch}, index);
  const int64_t dy = rng.randint(-translate, translate + 1);
  const int64_t dx = rng.randint(-translate, translate + 1);
  return {dy, dx};
}

Tensor gather_augmented(const Tensor& images, const std::vector<int64_t>& indices, const std::vector<uint8_t>& flips,
                        const std::vector<std::pair<int64_t, int64_t>>& shifts, MemoryFormat format) {
  LOOM_CHECK(images.dim() == 4 && images.dtype() == kFloat32 && images.device().is_cpu() && images.is_contiguous(),
             "gather_augmented: expected contiguous float32 CPU images [N, C, H, W], got ", images.str());
  LOOM_CHECK(flips.size() == indices.size() && shifts.size() == indices.size(), "gather_augmented: ", indices.size(),
             " indices but ", flips.size(), " flips and ", shifts.size(), " shifts");
  const int64_t n = images.size(0), c = images.size(1), h = images.size(2), w = images.size(3);
  const auto b = static_cast<int64_t>(indices.size());
  for (int64_t i = 0; i < b; ++i) {
    const auto [dy, dx] = shifts[static_cast<size_t>(i)];
    LOOM_CHECK(indices[static_cast<size_t>(i)] >= 0 && indices[static_cast<size_t>(i)] < n, "gather_augmented: index ",
               indices[static_cast<size_t>(i)], " is out of range for ", n, " images");
    LOOM_CHECK(dy > -h && dy < h && dx > -w && dx < w, "gather_augmented: shift (", dy, ", ", dx,
               ") must be smaller than the image (", h, "x", w, ") for reflection");
  }
  Tensor out = empty({b, c, h, w}, TensorOptions(kFloat32), format);
  const bool nhwc = format == MemoryFormat::ChannelsLast;
  const float* src = images.data_ptr<float>();
  float* dst = out.data_ptr<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < b; ++i) {
    const float* image = src + indices[static_cast<size_t>(i)] * c * h * w;
    const bool mirrored = flips[static_cast<size_t>(i)] != 0;
    const auto [dy, dx] = shifts[static_cast<size_t>(i)];
    for (int64_t y = 0; y < h; ++y) {
      const int64_t sy = reflect(y + dy, h);
      for (int64_t x = 0; x < w; ++x) {
        // See Note [Reflect translate]: shift the mirrored image, so flip the shifted column.
        const int64_t shifted = reflect(x + dx, w);
        const int64_t sx = mirrored ? w - 1 - shifted : shifted;
        for (int64_t ch = 0; ch < c; ++ch) {
          const float v = image[(ch * h + sy) * w + sx];
          if (nhwc)
            dst[((i * h + y) * w + x) * c + ch] = v;
          else
            dst[((i * c + ch) * h + y) * w + x] = v;
        }
      }
    }
  }
  return out;
}

InMemoryLoader::InMemoryLoader(Tensor images, Tensor labels, InMemoryLoaderOptions options)
    : images_(std::move(images)), labels_(std::move(labels)), options_(options) {
  LOOM_CHECK(images_.defined() && images_.dim() == 4 && images_.dtype() == kFloat32,
             "InMemoryLoader: expected float32 images [N, C, H, W], got ",
             images_.defined() ? images_.str() : std::string("an undefined tensor"));
  images_ = images_.to(Device("cpu")).contiguous();
  LOOM_CHECK(labels_.defined() && labels_.dim() == 1 && labels_.size(0) == images_.size(0),
             "InMemoryLoader: expected labels [", images_.size(0), "] (one per image), got ",
             labels_.defined() ? labels_.str() : std::string("an undefined tensor"));
  label_values_ = labels_.to(kInt64).tolist<int64_t>();
  LOOM_CHECK(options_.batch_size >= 1, "InMemoryLoader: batch_size must be positive, got ", options_.batch_size);
  LOOM_CHECK(options_.world_size >= 1 && options_.rank >= 0 && options_.rank < options_.world_size,
             "InMemoryLoader: rank ", options_.rank, " is not in a world of ", options_.world_size);
  LOOM_CHECK(options_.batch_size % options_.world_size == 0, "InMemoryLoader: the global batch_size ",
             options_.batch_size, " must divide evenly among ", options_.world_size, " ranks");
  LOOM_CHECK(options_.world_size == 1 || options_.drop_last || images_.size(0) % options_.batch_size == 0,
             "InMemoryLoader: with ", options_.world_size, " ranks the last partial batch (", images_.size(0) %
             options_.batch_size, " images) cannot be split evenly; set drop_last");
  LOOM_CHECK(options_.translate >= 0 && options_.translate < images_.size(2) && options_.translate < images_.size(3),
             "InMemoryLoader: translate must be in [0, image size), got ", options_.translate);
}

int64_t InMemoryLoader::size() const { return num_batches(images_.size(0), options_.batch_size, options_.drop_last); }

InMemoryLoader::Epoch InMemoryLoader::epoch(int64_t epoch) const {
  LOOM_CHECK(epoch >= 0, "InMemoryLoader.epoch: expected a non-negative epoch, got ", epoch);
  return Epoch(this, epoch);
}

InMemoryLoader::Epoch::Epoch(const InMemoryLoader* loader, int64_t epoch) : loader_(loader), epoch_(epoch) {
  const int64_t n = loader_->images_.size(0);
  order_ = loader_->options_.shuffle ? random_permutation(n, loader_->options_.seed + static_cast<uint64_t>(epoch))
                                     : sequential_indices(n);
}

Batch InMemoryLoader::Epoch::batch(int64_t b) const {
  const InMemoryLoaderOptions& o = loader_->options_;
  const auto n = static_cast<int64_t>(order_.size());
  const int64_t start = b * o.batch_size, global = std::min(o.batch_size, n - start);
  LOOM_CHECK(b >= 0 && b < loader_->size(), "InMemoryLoader: batch ", b, " of an epoch of ", loader_->size());
  const int64_t local = global / o.world_size, first = start + o.rank * local;
  std::vector<int64_t> indices(order_.begin() + first, order_.begin() + first + local);
  std::vector<uint8_t> flips(indices.size());
  std::vector<std::pair<int64_t, int64_t>> shifts(indices.size());
  std::vector<int64_t> targets(indices.size());
  for (size_t i = 0; i < indices.size(); ++i) {
    flips[i] = flips_image(o.flip, o.seed, epoch_, indices[i]) ? 1 : 0;
    shifts[i] = translation(o.translate, o.seed, epoch_, indices[i]);
    targets[i] = loader_->label_values_[static_cast<size_t>(indices[i])];
  }
  return {gather_augmented(loader_->images_, indices, flips, shifts, o.memory_format),
          from_vector(targets, {local})};
}

InMemoryLoader::Epoch::Iterator::Iterator(const Epoch* epoch, int64_t index) : epoch_(epoch), index_(index) {
  if (index_ < epoch_->loader_->size()) batch_ = epoch_->batch(index_);
}

InMemoryLoader::Epoch::Iterator& InMemoryLoader::Epoch::Iterator::operator++() {
  ++index_;
  batch_ = index_ < epoch_->loader_->size() ? epoch_->batch(index_) : Batch{};
  return *this;
}

}  // namespace loom::data
