// InMemoryLoader: a whole image dataset held as one normalised tensor, cut into augmented
// batches per epoch without worker threads (the data path of the CIFAR-10 speedruns, where
// the 50,000 images fit in 600 MB and the augmentation is a gather).
//
//   data::InMemoryLoader loader(images, labels, {.batch_size = 1024, .shuffle = true, .drop_last = true,
//                                                .flip = data::Flip::alternating, .translate = 2, .seed = 0});
//   for (int64_t epoch = 0; epoch < epochs; ++epoch)
//     for (data::Batch& batch : loader.epoch(epoch)) train_step(batch.data, batch.target);
//
// `images` is float32 [N, C, H, W] already normalised (Normalize is a per-channel affine map,
// which commutes with the flips and the reflect padding below, so it is done once, not per
// batch); `labels` int64 [N].
//
// Flip::random flips each image with probability 1/2, drawn afresh every epoch (torchvision's
// RandomHorizontalFlip); Flip::alternating flips by Note [Alternating flip] (data/sample_rng.h).
//
// Note [Reflect translate]
// translate = t shifts each image by (dy, dx), each uniform in {-t, ..., t}, drawn per image
// per epoch, filling the uncovered border by reflection (F.pad(x, t, "reflect") then a random
// H x W crop): no black border, whose edge a net could learn. Output pixel (y, x) reads the
// (possibly flipped) source at (reflect(y + dy), reflect(x + dx)), so a batch is one gather.
//
// Randomness follows Note [Per-sample randomness] (data/sample_rng.h): the permutation of
// epoch e comes from (seed, e), and image i's coin and shift from (seed, e, i), so the batches
// are the same whatever the rank count: with world_size ranks, each global batch of
// batch_size is cut into world_size equal, consecutive slices and rank r takes slice r (the
// ranks together see exactly the single-process batch).
#pragma once

#include <cstdint>
#include <vector>

#include "core/memory_format.h"
#include "core/tensor.h"
#include "data/dataset.h"  // defines: Batch

namespace loom::data {

enum class Flip { none, random, alternating };

struct InMemoryLoaderOptions {
  int64_t batch_size = 1;  // global: the sum over the ranks
  bool shuffle = false;
  bool drop_last = false;
  Flip flip = Flip::none;
  int64_t translate = 0;  // See Note [Reflect translate]
  uint64_t seed = 0;
  int64_t rank = 0, world_size = 1;
  MemoryFormat memory_format = MemoryFormat::Contiguous;  // of the batches
};

// Whether image i is mirrored in `epoch` (the rules of Note [Alternating flip]).
bool flips_image(Flip flip, uint64_t seed, int64_t epoch, int64_t index);
// Image i's (dy, dx) in `epoch`, each in {-translate, ..., translate}.
std::pair<int64_t, int64_t> translation(int64_t translate, uint64_t seed, int64_t epoch, int64_t index);

// out[b] = image indices[b] of `images`, mirrored where flips[b], shifted by shifts[b] with
// reflection (Note [Reflect translate]). images: float32 [N, C, H, W] (NCHW-contiguous);
// the result is [B, C, H, W] in `format`. Each |shift| must be below H and W.
Tensor gather_augmented(const Tensor& images, const std::vector<int64_t>& indices, const std::vector<uint8_t>& flips,
                        const std::vector<std::pair<int64_t, int64_t>>& shifts,
                        MemoryFormat format = MemoryFormat::Contiguous);

class InMemoryLoader {
 public:
  InMemoryLoader(Tensor images, Tensor labels, InMemoryLoaderOptions options);

  // Batches per epoch.
  int64_t size() const;
  int64_t dataset_size() const { return images_.size(0); }
  const InMemoryLoaderOptions& options() const { return options_; }

  // One epoch's batches, made one at a time as the loop asks for them.
  class Epoch {
   public:
    class Iterator {
     public:
      Batch& operator*() { return batch_; }
      Iterator& operator++();
      bool operator!=(const Iterator& other) const { return index_ != other.index_; }

     private:
      friend class Epoch;
      Iterator(const Epoch* epoch, int64_t index);
      const Epoch* epoch_;
      int64_t index_;
      Batch batch_;
    };
    Iterator begin() const { return Iterator(this, 0); }
    Iterator end() const { return Iterator(this, loader_->size()); }
    // Batch b of this epoch (this rank's slice of it).
    Batch batch(int64_t b) const;

   private:
    friend class InMemoryLoader;
    Epoch(const InMemoryLoader* loader, int64_t epoch);
    const InMemoryLoader* loader_;
    int64_t epoch_;
    std::vector<int64_t> order_;
  };
  Epoch epoch(int64_t epoch) const;

 private:
  Tensor images_, labels_;
  std::vector<int64_t> label_values_;
  InMemoryLoaderOptions options_;
};

}  // namespace loom::data
