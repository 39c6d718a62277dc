// Views share storage and re-describe it; their gradients map back to the input.
#include <doctest/doctest.h>

#include "autograd/ops.h"
#include "gradcheck.h"

using namespace loom;
using loom::testing::gradcheck;
using loom::testing::leaf;

TEST_CASE("views share storage and compute strides like PyTorch") {
  Tensor x = arange(0, 24, 1, kFloat32).reshape({2, 3, 4});
  CHECK(x.strides() == Shape{12, 4, 1});
  Tensor t = x.transpose(0, 2);
  CHECK(t.shape() == Shape{4, 3, 2});
  CHECK(t.strides() == Shape{1, 4, 12});
  CHECK_FALSE(t.is_contiguous());
  CHECK(t.storage() == x.storage());
  Tensor n = x.narrow(2, 1, 2);
  CHECK(n.storage_offset() == 1);
  CHECK(n.tolist<float>() == std::vector<float>{1, 2, 5, 6, 9, 10, 13, 14, 17, 18, 21, 22});
  Tensor s = x.select(1, 2);
  CHECK(s.shape() == Shape{2, 4});
  CHECK(s.tolist<float>() == std::vector<float>{8, 9, 10, 11, 20, 21, 22, 23});
  CHECK(x.slice(2, 0, 4, 2).tolist<float>()[1] == 2);
  Tensor e = from_vector<float>({1, 2, 3}, {3, 1}).expand({3, 4});
  CHECK(e.strides() == Shape{1, 0});
  CHECK(e.tolist<float>() == std::vector<float>{1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3});
  CHECK(x.unsqueeze(1).shape() == Shape{2, 1, 3, 4});
  CHECK(x.unsqueeze(-1).shape() == Shape{2, 3, 4, 1});
  CHECK(x.unsqueeze(0).squeeze().shape() == Shape{2, 3, 4});
  CHECK(x.flatten(1).shape() == Shape{2, 12});
  CHECK(x.view({-1, 4}).shape() == Shape{6, 4});
  CHECK(x.permute({1, 2, 0}).contiguous().tolist<float>()[1] == 12);
  // A view of a view: splitting a dim of a transposed tensor still needs no copy.
  Tensor v = x.transpose(0, 1).view({3, 2, 2, 2});
  CHECK(v.storage() == x.storage());
  // Writing through a view changes the base (and bumps the shared version counter).
  uint32_t before = x.version();
  n.fill_(-1);
  CHECK(x.tolist<float>()[1] == -1);
  CHECK(x.version() == before + 1);
}

TEST_CASE("reshape copies only when it must; view refuses") {
  Tensor x = arange(0, 6, 1, kFloat32).reshape({2, 3});
  Tensor t = x.t();
  CHECK_THROWS_WITH_AS(t.view({6}), doctest::Contains("use reshape()"), Error);
  Tensor r = t.reshape({6});
  CHECK(r.storage() != x.storage());
  CHECK(r.tolist<float>() == std::vector<float>{0, 3, 1, 4, 2, 5});
  CHECK_THROWS_WITH_AS(x.view({4, 2}), doctest::Contains("invalid for input of shape [2, 3]"), Error);
  CHECK_THROWS_WITH_AS(x.view({-1, -1}), doctest::Contains("only one dimension"), Error);
  CHECK_THROWS_WITH_AS(x.expand({4, 3, 4}), doctest::Contains("must match the existing size 3"), Error);
  CHECK_THROWS_WITH_AS(x.narrow(1, 2, 2), doctest::Contains("exceeds dimension 1 of size 3"), Error);
  CHECK_THROWS_WITH_AS(x.select(0, 2), doctest::Contains("out of bounds"), Error);
  CHECK_THROWS_WITH_AS(x.permute({0, 0}), doctest::Contains("repeats"), Error);
  CHECK_THROWS_WITH_AS(x.transpose(0, 2), doctest::Contains("dimension out of range"), Error);
}

TEST_CASE("to(dtype) and to(device) convert and copy") {
  Tensor x = from_vector<float>({1.5f, -2.25f, 3}, {3});
  CHECK(x.to(kFloat64).tolist<double>() == std::vector<double>{1.5, -2.25, 3});
  CHECK(x.to(kInt64).tolist<int64_t>() == std::vector<int64_t>{1, -2, 3});
  Tensor y = x.to(Device("cpu:1"));
  CHECK(y.device() == Device("cpu:1"));
  CHECK(y.storage() != x.storage());
  CHECK(y.tolist<float>() == x.tolist<float>());
  CHECK(x.to(kBFloat16).to(kFloat32).tolist<float>() == std::vector<float>{1.5f, -2.25f, 3});
  CHECK(x.to(kFloat16).to(kFloat32).tolist<float>() == std::vector<float>{1.5f, -2.25f, 3});
  // Ops refuse to mix virtual devices, as they would refuse to mix two GPUs.
  CHECK_THROWS_WITH_AS((void)(x + y), doctest::Contains("same device"), Error);
}

TEST_CASE("gradients of view ops") {
  Tensor x = leaf({2, 3, 4}, 21);
  gradcheck([](const auto& in) { return in[0].reshape({4, 6}); }, {x});
  gradcheck([](const auto& in) { return in[0].view({6, -1}); }, {x});
  gradcheck([](const auto& in) { return in[0].permute({2, 0, 1}); }, {x});
  gradcheck([](const auto& in) { return in[0].transpose(0, 1); }, {x});
  gradcheck([](const auto& in) { return in[0].narrow(2, 1, 2); }, {x});
  gradcheck([](const auto& in) { return in[0].slice(2, 0, 4, 3); }, {x});
  gradcheck([](const auto& in) { return in[0].select(1, -1); }, {x});
  gradcheck([](const auto& in) { return in[0].unsqueeze(1).expand({2, 5, 3, 4}); }, {x});
  gradcheck([](const auto& in) { return in[0].flatten(); }, {x});
  gradcheck([](const auto& in) { return in[0].unsqueeze(0).squeeze(0); }, {x});
  gradcheck([](const auto& in) { return in[0].transpose(0, 2).contiguous(); }, {x});
  gradcheck([](const auto& in) { return in[0].transpose(0, 2).reshape({-1}); }, {x});
  gradcheck([](const auto& in) { return in[0].clone(); }, {x});
  gradcheck([](const auto& in) { return in[0].to(Device("cpu:1")).to(Device("cpu:0")); }, {x});
  gradcheck([](const auto& in) { return in[0].to(kFloat32).to(kFloat64); }, {x}, 1e-3, 1e-3, 1e-3);
}

TEST_CASE("narrow names a negative length as such") {
  CHECK_THROWS_WITH_AS(narrow(zeros({5}), 0, 0, -1), doctest::Contains("narrow: length must be non-negative, got -1"),
                       Error);
  CHECK_THROWS_WITH_AS(narrow(zeros({5}), 0, 3, 3), doctest::Contains("start (3) + length (3) exceeds dimension 0"),
                       Error);
  CHECK(narrow(zeros({5}), 0, -2, 2).shape() == Shape{2});
}
