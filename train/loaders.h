// The data each rank trains and evaluates on: CIFAR-10 (or synthetic images of its shape)
// with examples/reference/train_ddp.py's transforms, and the loaders over this rank's
// shard of it.
//
//   Loaders data(config, dist);
//   for (data::Batch& batch : data.train) ...      // this rank's share of the epoch
//   evaluate(model, ..., data.test, ..., data.eval_real);
#pragma once

#include <cstdint>
#include <memory>

#include "data/dataloader.h"    // defines: DataLoader
#include "data/dataset.h"       // defines: Dataset
#include "data/sampler.h"       // defines: Sampler
#include "train/distributed.h"  // defines: Distributed (the rank's shard)
#include "train/trainer.h"      // defines: TrainConfig

namespace loom::training {

// The training (`train`) or test set the config names, with its transforms: random crop
// and flip for training when config.data.augment, normalisation always.
std::shared_ptr<data::Dataset> make_dataset(const TrainConfig& config, bool train);

// The data: each rank its shard of every epoch (a DistributedSampler over the "batch"
// ranks, shuffled per epoch; in one process the loader shuffles), and its in-order share
// of the first eval_count test images, padding excluded (Note [Evaluating a shard without
// double counting]): --eval-limit is exact, not rounded up to whole batches.
struct Loaders {
  std::shared_ptr<data::Dataset> train_set, test_set;
  int64_t eval_count;
  std::shared_ptr<data::Sampler> train_sampler;
  data::DataLoader train, test;
  int64_t steps_per_epoch, eval_real;

  Loaders(const TrainConfig& c, const Distributed& dist)
      : train_set(make_dataset(c, /*train=*/true)),
        test_set(make_dataset(c, /*train=*/false)),
        eval_count(c.data.eval_limit >= 0 ? std::min(c.data.eval_limit, test_set->size()) : test_set->size()),
        train_sampler(dist.train_sampler(train_set->size(), c)),
        train(train_set, {.batch_size = c.data.batch_size,
                          .shuffle = train_sampler ? false : c.data.shuffle,
                          .sampler = train_sampler,
                          .num_workers = c.data.workers,
                          .persistent_workers = c.data.workers > 0,
                          .seed = c.training.seed}),
        test(test_set, {.batch_size = 256,
                        .sampler = dist.eval_sampler(eval_count),
                        .num_workers = c.data.workers,
                        .persistent_workers = c.data.workers > 0}),
        steps_per_epoch(train.size()),
        eval_real(dist.real_examples(eval_count)) {}
};

}  // namespace loom::training
