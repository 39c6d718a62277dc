#include "parallel/pipeline/pipeline_processes.h"

#include <algorithm>  // defines: std::max_element
#include <map>        // defines: std::map (ranks grouped by balance, for the error)

#include "core/error.h"
#include "core/factory.h"  // defines: from_vector

namespace loom::parallel::pipeline {

namespace {

// Every rank's int64 list, in rank order, on every rank: the lengths first, then the lists
// padded to the longest (two all_gathers of `world`).
std::vector<std::vector<int64_t>> all_gather_lists(const std::vector<int64_t>& mine,
                                                   distributed::Communicator& world) {
  auto gather = [&world](const std::vector<int64_t>& values) {
    Tensor local = distributed::to_communication_device(from_vector(values, {int64_t(values.size())}), world);
    std::vector<Tensor> all;
    world.all_gather(all, local)->wait();
    std::vector<std::vector<int64_t>> out;
    for (const Tensor& t : all) out.push_back(t.tolist<int64_t>());
    return out;
  };
  std::vector<int64_t> lengths;
  for (const auto& l : gather({int64_t(mine.size())})) lengths.push_back(l[0]);
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  std::vector<int64_t> padded = mine;
  padded.resize(size_t(std::max<int64_t>(longest, 1)), 0);
  std::vector<std::vector<int64_t>> all = gather(padded);
  for (size_t r = 0; r < all.size(); ++r) all[r].resize(size_t(lengths[r]));
  return all;
}

}  // namespace

void check_same_balance(const std::vector<int64_t>& balance, distributed::Communicator& world) {
  const std::vector<std::vector<int64_t>> all = all_gather_lists(balance, world);
  std::map<std::vector<int64_t>, std::string> ranks_of;  // each balance held, and by which ranks
  for (size_t r = 0; r < all.size(); ++r) ranks_of[all[r]] += (ranks_of[all[r]].empty() ? "" : ", ") + std::to_string(r);
  if (ranks_of.size() == 1) return;
  std::string held;
  for (const auto& [b, ranks] : ranks_of) held += detail::str("\n  ranks ", ranks, ": ", balance_str(b));
  LOOM_CHECK(false, "the ranks cut the model into pipeline stages differently:", held,
             "\nEvery rank must cut alike (Note [One balance for every rank]): pass every rank the same balance, or "
             "leave it to balance_by \"cost\" (the default), which every rank computes alike");
}

// See Note [One balance for every rank].
std::vector<int64_t> agree_on_balance(nn::Sequential& layers, const std::vector<int64_t>& balance,
                                      const std::string& by, int64_t stages, const Tensor& sample,
                                      distributed::Communicator& world) {
  check_balance_by(by);  // on every rank, before rank 0 alone might stop on it
  std::vector<int64_t> agreed;
  if (!balance.empty() || by != "time") {
    agreed = choose_balance(layers, balance, by, stages, sample);
  } else {
    agreed.assign(size_t(stages), 0);
    if (world.rank() == 0) agreed = choose_balance(layers, {}, by, stages, sample);
    Tensor t = distributed::to_communication_device(from_vector(agreed, {stages}), world);
    world.broadcast(t, 0)->wait();
    agreed = t.tolist<int64_t>();
  }
  check_same_balance(agreed, world);
  return agreed;
}

std::shared_ptr<PipelineStage> apply_pipeline_processes(std::shared_ptr<nn::Sequential> layers,
                                                        std::shared_ptr<distributed::Communicator> group, Device device,
                                                        const PipelineProcessOptions& options,
                                                        PipelineStage::LossFn loss_fn, const Tensor& sample,
                                                        std::shared_ptr<distributed::Communicator> world) {
  LOOM_CHECK(layers != nullptr && group != nullptr, "apply_pipeline_processes: the layers or the group is null");
  LOOM_CHECK(options.virtual_stages >= 1, "apply_pipeline_processes: virtual_stages: expected at least 1, got ",
             options.virtual_stages);
  LOOM_CHECK(options.virtual_stages == 1 || options.schedule == "interleaved_1f1b", "apply_pipeline_processes: ",
             options.virtual_stages, " virtual stages per stage need the schedule interleaved_1f1b, got ",
             options.schedule);
  const int64_t virtual_stages = group->size() * options.virtual_stages;  // the model's S·V pieces
  const std::vector<int64_t> balance =
      agree_on_balance(*layers, options.balance, options.balance_by, virtual_stages, sample, world ? *world : *group);
  auto stage = std::make_shared<PipelineStage>(std::move(layers), balance, std::move(group), device,
                                               options.n_microbatches, options.schedule, std::move(loss_fn));
  stage->set_checkpoint(options.checkpoint);
  return stage;
}

}  // namespace loom::parallel::pipeline
