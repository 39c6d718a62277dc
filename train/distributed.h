// What running as several processes adds to the training loop (trainer.cpp), in one
// place, so that the loop reads the same in every mode:
//
//   Distributed dist(config);                 // across processes: init_process_group from
//                                             // loomrun's env, the ParallelDims and their DeviceMesh
//   auto net = parallelize(model, dist.mesh(), config, ...);   // parallelize.h
//   DataLoader train(set, {.sampler = dist.train_sampler(...)});   // each rank its shard
//   ...
//   RunningMetrics epoch = dist.sum(metrics); // every rank's examples, on every rank
//   if (dist.is_main()) print(...), save(...);
//   dist.barrier();
//
// In single mode every member is the identity: rank 0 of 1, no communication.
//
// Note [Evaluating a shard without double counting]
// Each rank evaluates its share of the test set, in order: DistributedSampler without
// shuffle gives rank r the images r, r + R, r + 2R, ... After the N real images it pads
// every rank to the same count by repeating images from the start, so that every rank
// runs the same number of batches (and so the same DDP collectives). The padding must
// not count twice: rank r counts only its first ceil((N - r) / R) images, the real ones,
// and the all-reduced sums then cover each test image exactly once. --eval-limit L
// evaluates exactly the first L images this way, in every mode (one process: R = 1).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <optional>

#include "data/sampler.h"
#include "parallel/parallel_dims.h"        // defines: ParallelDims
#include "train/progress.h"
#include "train/trainer.h"
#include "parallel/comm/communicator.h"
#include "parallel/comm/new_group.h"   // defines: World (ranks as threads)
#include "parallel/device_mesh.h"          // defines: DeviceMesh

namespace loom::training {

class Distributed {
 public:
  // Resolves the degrees (degrees.h); across processes joins the process group, prints
  // them once and builds their mesh (collectives). With `world`, the ranks are that world's
  // (threads of this process, each with its own World over one store: the memory
  // estimator's advice) and no process group is joined; `world` must outlive this object
  // (its mesh makes groups through it).
  explicit Distributed(const TrainConfig& config, distributed::World* world = nullptr);
  // Leaves the process group, after every rank has arrived (not while unwinding an
  // error: then the process exits and loomrun stops the others).
  ~Distributed();
  Distributed(const Distributed&) = delete;
  Distributed& operator=(const Distributed&) = delete;

  bool enabled() const { return comm_ != nullptr; }
  int rank() const { return rank_; }
  int world_size() const { return world_; }
  bool is_main() const { return rank_ == 0; }

  const distributed::ParallelDims& dims() const { return dims_; }
  // Whether this rank's examples count in the summed metrics: the stages of a pipeline
  // (--pp) see the same batches, and only the last has the outputs to score, so only it
  // counts; so does one rank of a tensor-parallel group.
  bool counts_examples() const { return at_.pp == dims_.pp - 1 && at_.tp == 0; }
  // The whole world's process group; null in one process.
  std::shared_ptr<distributed::Communicator> world() const { return comm_; }
  // The mesh over the processes; null in one process.
  const distributed::DeviceMesh* mesh() const { return mesh_ ? &*mesh_ : nullptr; }

  // Training order: null in one process (the loader shuffles), else this rank's
  // DistributedSampler over the data-parallel ranks (shuffled by (seed, epoch); the
  // loader forwards set_epoch).
  std::shared_ptr<data::Sampler> train_sampler(int64_t dataset_size, const TrainConfig& config) const;
  // Evaluation: this rank's in-order share of the first `count` images (single mode:
  // all of them); real_examples() says how many of them to count. See Note
  // [Evaluating a shard without double counting].
  std::shared_ptr<data::Sampler> eval_sampler(int64_t count) const;
  int64_t real_examples(int64_t count) const;

  // Sums (or maxima) over ranks; the value itself in single mode.
  RunningMetrics sum(const RunningMetrics& metrics) const;
  double sum(double value) const;
  double max(double value) const;
  // Every rank's value, in rank order, on every rank; {value} in single mode.
  std::vector<double> all_gather(double value) const;
  void barrier() const;

 private:
  std::shared_ptr<distributed::Communicator> comm_;  // the whole world's
  bool joined_process_group_ = false;                // comm_ is the default group: leave it at the end
  int rank_ = 0, world_ = 1;
  distributed::ParallelDims dims_;
  distributed::ParallelDims::Coordinates at_;  // this rank's place: at_.batch is the shard of data it reads
  std::optional<distributed::DeviceMesh> mesh_;
};

}  // namespace loom::training
