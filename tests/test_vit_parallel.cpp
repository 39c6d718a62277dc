// The Vision Transformer under the parallel modes, against one process on the whole batch:
// a pipeline over its sequential() view gives the same gradients; FSDP with one unit per
// encoder block and AdamW over the shards ends with the same weights; DDP + AdamW (and
// clip_grad_norm_) ends with the same weights; ZeRO-1 sharding AdamW's state ends with
// DDP + AdamW's weights bit for bit, its consolidated state_dict AdamW's own (step,
// exp_avg, exp_avg_sq). Ranks are threads (tests/rank_threads.h).
#include <doctest/doctest.h>

#include "autograd/ops.h"                            // defines: cross_entropy, randn, randint
#include "nn/optim/adamw.h"                          // defines: AdamW, param_groups_weight_decay
#include "nn/optim/clip_grad.h"                      // defines: clip_grad_norm_
#include "nn/vision_transformer.h"                   // defines: VisionTransformer
#include "parallel/ddp/distributed_data_parallel.h"  // defines: DistributedDataParallel
#include "parallel/fsdp/fully_sharded_data_parallel.h"  // defines: FullyShardedDataParallel, FSDPOptions
#include "parallel/fsdp/state_dict.h"                // defines: full_state_dict
#include "parallel/pipeline/pipeline.h"              // defines: Pipeline
#include "parallel/zero_redundancy_optimizer.h"      // defines: ZeroRedundancyOptimizer, optimizer_class

#ifdef LOOM_WITH_GLOO
#include "rank_threads.h"  // defines: run_ranks, require_no_errors
#include "transparency.h"  // defines: max_param_diff, max_grad_diff

using namespace loom;
using distributed::Communicator;
using loom::testing::max_abs_diff;
using loom::testing::max_grad_diff;
using loom::testing::max_param_diff;
using loom::testing::require_no_errors;
using loom::testing::run_ranks;

namespace {

constexpr int kSteps = 3;

std::shared_ptr<nn::VisionTransformer> micro_vit() {
  return std::make_shared<nn::VisionTransformer>(nn::VisionTransformerOptions{
      .image_size = 8, .patch_size = 4, .num_layers = 2, .num_heads = 2, .hidden_dim = 8, .mlp_dim = 16});
}
const optim::AdamWOptions kAdamW{.lr = 3e-3, .weight_decay = 0.05};

std::vector<optim::ParamGroup> groups_of(nn::Module& model) {
  return optim::param_groups_weight_decay(model, kAdamW.weight_decay,
                                          dynamic_cast<nn::VisionTransformer&>(model).no_weight_decay());
}

// kSteps of forward, backward, clipping at 1.0 (when `params_of` is given) and `opt` on
// the rows [first, first + rows) of each batch.
void train(nn::Module& model, nn::Module* params_of, optim::Optimizer& opt, const std::vector<Tensor>& images,
           const std::vector<Tensor>& labels, int64_t first, int64_t rows) {
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    cross_entropy(model(images[s].narrow(0, first, rows)), labels[s].narrow(0, first, rows)).backward();
    if (params_of) nn::utils::clip_grad_norm_(params_of->parameters(), 1.0);
    opt.step();
  }
}

struct Data {
  std::vector<Tensor> images, labels;
};

Data make_data(int64_t batch) {
  Data d;
  for (int s = 0; s < kSteps; ++s) {
    d.images.push_back(randn({batch, 3, 8, 8}, kFloat64));
    d.labels.push_back(randint(0, 10, {batch}));
  }
  return d;
}

}  // namespace

TEST_CASE("transparency: a pipeline over ViT's sequential() gives one device's gradients (1F1B and GPipe)") {
  for (const char* schedule : {"1f1b", "gpipe"}) {
    CAPTURE(schedule);
    manual_seed(5);
    auto model = micro_vit();
    model->to(kFloat64);
    auto reference = model->clone();
    Tensor images = randn({8, 3, 8, 8}, kFloat64), labels = randint(0, 10, {8});
    cross_entropy((*reference)(images), labels).backward();
    // Embedding, pos_drop | blocks.0, blocks.1, norm, pooling, head.
    auto layers = model->sequential();
    REQUIRE(layers->size() == 7);
    parallel::pipeline::Pipeline pipe(layers, {Device("cpu:0"), Device("cpu:1")}, {2, 5}, /*n_microbatches=*/4,
                                      schedule, [](const Tensor& out, const Tensor& y) { return cross_entropy(out, y); });
    pipe.step(images.to(Device("cpu:0")), labels.to(Device("cpu:1")));
    CHECK(max_grad_diff(*model, *reference) < 1e-12);
  }
}

TEST_CASE("transparency: DDP + AdamW on ViT equals one process on the whole batch; ZeRO-1 + AdamW equals DDP bit for bit") {
  const int world = 2;
  const int64_t batch = 8;
  manual_seed(3);
  auto start = micro_vit();
  start->to(kFloat64);
  const Data data = make_data(batch);
  const std::vector<Tensor>& images = data.images;
  const std::vector<Tensor>& labels = data.labels;
  // One process, the whole batch.
  auto single = start->clone();
  {
    optim::AdamW opt(groups_of(*single), kAdamW);
    train(*single, single.get(), opt, images, labels, 0, batch);
  }
  CHECK(max_param_diff(*single, *start) > 1e-3);  // it trained
  std::vector<std::shared_ptr<nn::Module>> plain, zero;
  for (int r = 0; r < world; ++r) {
    plain.push_back(start->clone());
    zero.push_back(start->clone());
  }
  require_no_errors(run_ranks(world, [&](std::shared_ptr<Communicator> comm) {
    const int r = comm->rank();
    const int64_t rows = batch / world;
    {
      ddp::DistributedDataParallel ddp(plain[r], comm);
      optim::AdamW opt(groups_of(*plain[r]), kAdamW);
      train(ddp, plain[r].get(), opt, images, labels, r * rows, rows);
    }
    ddp::DistributedDataParallel ddp(zero[r], comm);
    parallel::ZeroRedundancyOptimizer opt(groups_of(*zero[r]), parallel::optimizer_class<optim::AdamW>(kAdamW), comm);
    train(ddp, zero[r].get(), opt, images, labels, r * rows, rows);
    opt.consolidate_state_dict(0);
    if (r == 0) {
      OrderedDict<Tensor> whole = opt.state_dict();
      CHECK(whole.contains("state.0.step"));
      CHECK(whole["state.0.step"].dim() == 0);
      CHECK(whole["state.0.step"].item<float>() == kSteps);
      CHECK(whole.contains("state.0.exp_avg_sq"));
    }
  }));
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    CHECK(max_param_diff(*plain[r], *single) < 1e-12);  // the mean of two half-batch gradients: float rounding
    CHECK(max_param_diff(*zero[r], *plain[0]) == 0.0);  // the same arithmetic on the same gradients
  }
}
TEST_CASE("transparency: FSDP with one unit per encoder block and AdamW over the shards equals one process") {
  const int world = 2;
  const int64_t batch = 8;
  manual_seed(9);
  auto start = micro_vit();
  start->to(kFloat64);
  const Data data = make_data(batch);
  auto single = start->sequential()->clone();  // positional names, as FSDP's over the same view
  {
    optim::AdamW opt(single->parameters(), kAdamW);
    train(*single, nullptr, opt, data.images, data.labels, 0, batch);
  }
  std::vector<std::shared_ptr<nn::Module>> copies;
  for (int r = 0; r < world; ++r) copies.push_back(start->clone());
  OrderedDict<Tensor> gathered;
  require_no_errors(run_ranks(world, [&](std::shared_ptr<Communicator> comm) {
    const int r = comm->rank();
    auto vit = std::dynamic_pointer_cast<nn::VisionTransformer>(copies[r]);
    fsdp::FullyShardedDataParallel model(
        vit->sequential(), comm, fsdp::FSDPOptions{.auto_wrap_policy = {{"TransformerEncoderLayer"}}});
    // The embedding (with pos_drop), each block, and the head (norm, pooling, head).
    CHECK(model.units().size() == 4);
    optim::AdamW opt(model.parameters(), kAdamW);  // over this rank's shards
    train(model, nullptr, opt, data.images, data.labels, r * (batch / world), batch / world);
    OrderedDict<Tensor> full = fsdp::full_state_dict(model);
    if (r == 0) gathered = full;
  }));
  auto want = single->state_dict();
  CHECK(max_abs_diff(want["2.linear1.weight"], start->sequential()->state_dict()["2.linear1.weight"]) > 1e-4);  // it trained
  REQUIRE(gathered.size() == want.size());
  for (const auto& item : want) {
    const std::string& key = item.first;
    CAPTURE(key);
    CHECK(max_abs_diff(gathered[key], item.second) < 1e-12);
  }
}
#endif
