// A small program for test_pipeline_launch: the pipeline with one process per stage under
// loomrun (apply_pipeline_processes), or the in-process Pipeline as the reference, on the
// same small model and batches; rank 0 saves the weights after `steps` SGD steps.
//
//   loomrun --nproc_per_node 2 pipeline_worker processes SCHEDULE BALANCE MICROBATCHES OUT [DIE_RANK]
//   pipeline_worker reference SCHEDULE BALANCE STAGES MICROBATCHES OUT
//
// BALANCE is comma-separated layer counts ("" or "-": measured on rank 0). With DIE_RANK,
// that rank's process exits (status 7) in its second micro-batch's forward: a stage
// that dies mid-step, for loomrun to stop the others.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "core/factory.h"
#include "core/generator.h"
#include "nn/nn.h"
#include "nn/optim/sgd.h"
#include "nn/safetensors.h"                          // defines: nn::save
#include "parallel/comm/process_group.h"             // defines: init_process_group, default_group
#include "parallel/pipeline/pipeline.h"              // defines: Pipeline
#include "parallel/pipeline/pipeline_processes.h"    // defines: apply_pipeline_processes

using namespace loom;

namespace {

// Exits the process on its `when`-th forward.
struct DieOnCall : nn::Cloneable<DieOnCall> {
  explicit DieOnCall(int when) : Cloneable("DieOnCall"), when(when) {}
  void reset() override {}
  Tensor forward(const Tensor& x) override {
    if (++calls == when) {
      std::fprintf(stderr, "pipeline_worker: dying in forward call %d\n", calls);
      std::fflush(stderr);
      ::_exit(7);
    }
    return x;
  }
  int when, calls = 0;
};

// die_at: 0 for the plain 6 layers; else a DieOnCall(die_at) after layer 2 (-1: never).
std::shared_ptr<nn::Sequential> make_net(int die_at) {
  std::vector<std::shared_ptr<nn::Module>> layers = {
      std::make_shared<nn::Conv2d>(3, 6, 3, 1, 1), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Conv2d>(6, 8, 3, 2, 1), std::make_shared<nn::ReLU>(), std::make_shared<nn::Flatten>(1),
      std::make_shared<nn::Linear>(8 * 4 * 4, 10)};
  if (die_at != 0) layers.insert(layers.begin() + 3, std::make_shared<DieOnCall>(die_at));
  auto net = std::make_shared<nn::Sequential>(layers);
  net->to(kFloat64);
  return net;
}

std::vector<int64_t> parse_balance(const std::string& text) {
  std::vector<int64_t> out;
  if (text.empty() || text == "-") return out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) out.push_back(std::stoll(item));
  return out;
}

Tensor loss_of(const Tensor& out, const Tensor& y) { return cross_entropy(out, y); }

constexpr int kSteps = 2;
constexpr int64_t kBatch = 8;

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode != "processes" && mode != "reference") {
      std::fprintf(stderr, "usage: pipeline_worker processes|reference ...\n");
      return 2;
    }
    const std::string schedule = argv[2];
    const std::vector<int64_t> balance = parse_balance(argv[3]);
    manual_seed(1);  // the same model and batches in every process
    int die_at = 0;  // every process the same layers; only DIE_RANK's layer exits
    if (mode == "processes" && argc > 6)
      die_at = std::getenv("RANK") && std::atoi(argv[6]) == std::atoi(std::getenv("RANK")) ? 2 : -1;
    auto net = make_net(die_at);
    std::vector<std::pair<Tensor, Tensor>> batches;
    for (int s = 0; s < kSteps; ++s) batches.push_back({randn({kBatch, 3, 8, 8}, kFloat64), randint(0, 10, {kBatch})});
    if (mode == "reference") {
      const int64_t stages = std::stoll(argv[4]), n_microbatches = std::stoll(argv[5]);
      std::vector<Device> devices;
      for (int64_t s = 0; s < stages; ++s) devices.push_back(Device(DeviceType::CPU, int(s)));
      parallel::pipeline::Pipeline pipe(net, devices, balance, n_microbatches, schedule, loss_of);
      optim::SGD opt(pipe.parameters(), {.lr = 0.1, .momentum = 0.9});
      for (const auto& [x, y] : batches) {
        opt.zero_grad();
        pipe.step(x, y);
        opt.step();
      }
      net->to(Device("cpu"));
      nn::save(*net, argv[6]);
      return 0;
    }
    const int64_t n_microbatches = std::stoll(argv[4]);
    distributed::init_process_group("gloo");
    auto group = distributed::default_group();
    const int64_t virtual_stages = balance.empty() ? 1 : static_cast<int64_t>(balance.size()) / group->size();
    auto stage = parallel::pipeline::apply_pipeline_processes(
        net, group, Device("cpu"), {.balance = balance, .n_microbatches = n_microbatches, .schedule = schedule,
                                    .virtual_stages = virtual_stages},
        loss_of, batches[0].first.narrow(0, 0, 2));
    std::optional<optim::SGD> opt;  // a stage of ReLU and Flatten has nothing to train
    if (!stage->parameters().empty()) opt.emplace(stage->parameters(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
    for (const auto& [x, y] : batches) {
      if (opt) opt->zero_grad();
      auto r = stage->step(x, y);
      if (opt) opt->step();
      if (group->rank() == 0) std::printf("loss %.10f\n", r.loss.item<double>());
    }
    stage->share_weights();
    if (group->rank() == 0) nn::save(*net, argv[5]);
    group.reset();
    distributed::destroy_process_group();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pipeline_worker: %s\n", e.what());
    return 1;
  }
}
