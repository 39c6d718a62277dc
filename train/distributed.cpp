#include "train/distributed.h"

#include <chrono>
#include <exception>
#include <vector>

#include "core/factory.h"                              // defines: from_vector
#include "train/degrees.h"                    // defines: needs_process_group, parallel_dims_from_flags
#include "data/distributed_sampler.h"                  // defines: DistributedSampler
#include "parallel/comm/process_group.h"               // defines: init_process_group, default_group

namespace loom::training {

namespace dist = loom::distributed;

Distributed::Distributed(const TrainConfig& config, distributed::World* world) {
  if (!needs_process_group(config)) {
    LOOM_CHECK(!config.parallel.sync_bn,
               "--sync-bn needs data-parallel processes (--mode ddp or fsdp, --dp-replicate or "
               "--dp-shard; with one process there is nothing to synchronise)");
    LOOM_CHECK(config.parallel.backend.empty(), "--backend needs processes (--mode ddp or fsdp, or a degree above 1)");
    dims_ = parallel_dims_from_flags(config, 1);
    return;
  }
  const Device device(config.training.device);
  const std::string backend =
      config.parallel.backend.empty() ? (device.is_cuda() ? "nccl" : "gloo") : config.parallel.backend;
  LOOM_CHECK(backend != "nccl" || device.is_cuda(), "--backend nccl moves CUDA tensors, but --device is ",
             config.training.device, "; use --backend gloo for CPU training");
  // gloo with --device cuda works (Note [CUDA tensors through gloo]): slower than nccl,
  // but it lets ranks share one GPU, as with PyTorch.
  // make_communicator says clearly when a backend is not built into this loom (nccl
  // needs the CUDA backend and NCCL; gloo needs libgloo-dev).
  if (world != nullptr) {
    std::vector<int> everyone(static_cast<size_t>(world->size));
    for (int r = 0; r < world->size; ++r) everyone[static_cast<size_t>(r)] = r;
    comm_ = dist::new_group(*world, everyone, "world");
  } else {
    const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(config.parallel.comm_timeout_s * 1000));
    dist::init_process_group(backend, "env://", timeout);
    comm_ = dist::default_group();
    joined_process_group_ = true;
  }
  rank_ = comm_->rank();
  world_ = comm_->size();
  dims_ = parallel_dims_from_flags(config, world_);
  at_ = dims_.coordinates(rank_);  // Note [Every rank coordinate comes from the mesh]
  if (rank_ == 0 && config.metrics.progress) std::fprintf(stderr, "parallel dims: %s\n", dims_.str().c_str());
  const std::string device_type = device.is_cuda() ? "cuda" : "cpu";
  if (world != nullptr) mesh_.emplace(dims_.build_mesh(device_type, *world));
  else mesh_.emplace(dims_.build_mesh(device_type));
}

Distributed::~Distributed() {
  if (!joined_process_group_ || std::uncaught_exceptions() > 0) return;
  try {
    comm_.reset();
    dist::destroy_process_group();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_cifar10: rank %d: leaving the process group: %s\n", rank_, e.what());
  }
}

std::shared_ptr<data::Sampler> Distributed::train_sampler(int64_t dataset_size, const TrainConfig& config) const {
  if (!comm_) return nullptr;
  return std::make_shared<data::DistributedSampler>(dataset_size, dims_.batch_size(), at_.batch, config.data.shuffle,
                                                    config.training.seed);
}

std::shared_ptr<data::Sampler> Distributed::eval_sampler(int64_t count) const {
  return std::make_shared<data::DistributedSampler>(count, dims_.batch_size(), at_.batch, /*shuffle=*/false);
}

int64_t Distributed::real_examples(int64_t count) const {
  // Rank r's k-th image is image r + k * R: real while r + k * R < count.
  const int64_t rank = at_.batch, size = dims_.batch_size();
  return count > rank ? (count - rank + size - 1) / size : 0;
}

// The metric tensors below are made on the host and reduced on the communicator's device:
// see Note [Metadata tensors travel on the communicator's device] (communicator.h).
RunningMetrics Distributed::sum(const RunningMetrics& m) const {
  if (!comm_) return m;
  Tensor t = dist::to_communication_device(from_vector<double>({m.loss_sum, m.correct, m.examples}, {3}), *comm_);
  comm_->all_reduce(t)->wait();
  auto v = t.tolist<double>();
  return RunningMetrics{v[0], v[1], v[2]};
}

double Distributed::sum(double value) const {
  if (!comm_) return value;
  Tensor t = dist::to_communication_device(from_vector<double>({value}, {1}), *comm_);
  comm_->all_reduce(t)->wait();
  return t.item<double>();
}

double Distributed::max(double value) const {
  if (!comm_) return value;
  Tensor t = dist::to_communication_device(from_vector<double>({value}, {1}), *comm_);
  comm_->all_reduce(t, dist::ReduceOp::Max)->wait();
  return t.item<double>();
}

std::vector<double> Distributed::all_gather(double value) const {
  if (!comm_) return {value};
  std::vector<Tensor> all;
  comm_->all_gather(all, dist::to_communication_device(from_vector<double>({value}, {1}), *comm_))->wait();
  std::vector<double> out;
  for (const Tensor& t : all) out.push_back(t.tolist<double>()[0]);
  return out;
}

void Distributed::barrier() const {
  if (comm_) comm_->barrier()->wait();
}

}  // namespace loom::training
