#include "parallel/pipeline/pipeline_processes.h"

#include "core/error.h"
#include "core/factory.h"             // defines: from_vector
#include "parallel/model_parallel.h"  // defines: balance_by_time

namespace loom::parallel::pipeline {

void check_balance(const std::vector<int64_t>& balance, int64_t chunks, int64_t layers) {
  int64_t total = 0;
  bool positive = true;
  for (int64_t b : balance) {
    total += b;
    positive = positive && b >= 1;
  }
  const std::string given = detail::str("got ", balance.size(), " entries adding up to ", total);
  LOOM_CHECK(static_cast<int64_t>(balance.size()) == chunks && total == layers && positive, "--balance: expected ",
             chunks, " positive layer counts (one per model chunk: stages × virtual stages) adding up to the "
             "Sequential's length, ", layers, " layers; ", given);
}

// See Note [One balance for every rank].
std::vector<int64_t> agree_on_balance(nn::Sequential& layers, const std::vector<int64_t>& balance, int64_t chunks,
                                      const Tensor& sample, distributed::Communicator& group) {
  if (!balance.empty()) {
    check_balance(balance, chunks, static_cast<int64_t>(layers.size()));
    return balance;
  }
  std::vector<int64_t> measured(static_cast<size_t>(chunks), 0);
  if (group.rank() == 0) measured = balance_by_time(layers, sample, chunks);
  Tensor t = distributed::to_communication_device(from_vector(measured, {chunks}), group);
  group.broadcast(t, 0)->wait();
  return t.tolist<int64_t>();
}

std::shared_ptr<PipelineStage> apply_pipeline_processes(std::shared_ptr<nn::Sequential> layers,
                                                        std::shared_ptr<distributed::Communicator> group, Device device,
                                                        const PipelineProcessOptions& options,
                                                        PipelineStage::LossFn loss_fn, const Tensor& sample) {
  LOOM_CHECK(layers != nullptr && group != nullptr, "apply_pipeline_processes: the layers or the group is null");
  LOOM_CHECK(options.virtual_stages >= 1, "--virtual-stages: expected at least 1, got ", options.virtual_stages);
  LOOM_CHECK(options.virtual_stages == 1 || options.schedule == "interleaved_1f1b", "--virtual-stages ",
             options.virtual_stages, " needs --pipeline-schedule interleaved_1f1b, got ", options.schedule);
  const int64_t chunks = group->size() * options.virtual_stages;
  const std::vector<int64_t> balance = agree_on_balance(*layers, options.balance, chunks, sample, *group);
  return std::make_shared<PipelineStage>(std::move(layers), balance, std::move(group), device, options.chunks,
                                         options.schedule, std::move(loss_fn));
}

}  // namespace loom::parallel::pipeline
