// What the transparency tests of the parallel modes share (tests/test_ddp.cpp,
// test_data_parallel.cpp, test_pipeline.cpp): the contract's model, a conv + linear net
// without batch statistics in float64, so that every mode must reproduce one device's
// gradients to rounding; and the largest difference between two models' parameters or
// gradients (on any devices: compared on cpu:0).
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <memory>

#include "nn/nn.h"
#include "rank_threads.h"  // defines: max_abs_diff

namespace loom::testing {

// 6 layers: Conv2d(3, 6), ReLU, Conv2d(6, 8, stride 2), ReLU, Flatten, Linear(128, 10);
// inputs [N, 3, 8, 8] in float64.
inline std::shared_ptr<nn::Sequential> small_net() {
  auto net = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Conv2d>(3, 6, 3, 1, 1), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Conv2d>(6, 8, 3, 2, 1), std::make_shared<nn::ReLU>(), std::make_shared<nn::Flatten>(1),
      std::make_shared<nn::Linear>(8 * 4 * 4, 10)});
  net->to(kFloat64);
  return net;
}

inline double max_param_diff(const nn::Module& a, const nn::Module& b) {
  auto pa = a.parameters(), pb = b.parameters();
  REQUIRE(pa.size() == pb.size());
  double m = 0;
  for (size_t i = 0; i < pa.size(); ++i) m = std::max(m, max_abs_diff(pa[i].to(Device("cpu:0")), pb[i].to(Device("cpu:0"))));
  return m;
}

inline double max_grad_diff(const nn::Module& a, const nn::Module& b) {
  auto pa = a.parameters(), pb = b.parameters();
  REQUIRE(pa.size() == pb.size());
  double m = 0;
  for (size_t i = 0; i < pa.size(); ++i) {
    REQUIRE(pa[i].grad().defined());
    REQUIRE(pb[i].grad().defined());
    m = std::max(m, max_abs_diff(pa[i].grad().to(Device("cpu:0")), pb[i].grad().to(Device("cpu:0"))));
  }
  return m;
}

}  // namespace loom::testing
