// Joining, splitting and indexing: cat, stack, split, chunk, index_select, gather and
// the index kernels, against hand-computed values and naive loops; gradients by finite
// differences; errors naming the offending tensor, index, dim and size.
#include <doctest/doctest.h>

#include <limits>

#include <algorithm>
#include <vector>

#include "autograd/ops.h"
#include "gradcheck.h"

using namespace loom;
using loom::testing::gradcheck;
using loom::testing::leaf;

namespace {

Tensor indices(const std::vector<int64_t>& values, const Shape& shape) { return from_vector<int64_t>(values, shape); }

std::vector<int64_t> sizes_along(const std::vector<Tensor>& pieces, int64_t dim) {
  std::vector<int64_t> sizes;
  for (const Tensor& p : pieces) sizes.push_back(p.size(dim));
  return sizes;
}

}  // namespace

TEST_CASE("cat along dims 0, 1 and -1, with strided inputs") {
  Tensor a = from_vector<float>({1, 2, 3, 4}, {2, 2});
  Tensor b = from_vector<float>({5, 6}, {1, 2});
  CHECK(cat({a, b}, 0).shape() == Shape{3, 2});
  CHECK(cat({a, b}, 0).tolist<float>() == std::vector<float>{1, 2, 3, 4, 5, 6});
  Tensor c = from_vector<float>({7, 8}, {2, 1});
  CHECK(cat({a, c}, 1).tolist<float>() == std::vector<float>{1, 2, 7, 3, 4, 8});
  CHECK(cat({c, a, c}, -1).tolist<float>() == std::vector<float>{7, 1, 2, 7, 8, 3, 4, 8});
  // A transposed input is read through its strides.
  CHECK(cat({a.t(), b}, 0).tolist<float>() == std::vector<float>{1, 3, 2, 4, 5, 6});
  // Integer tensors, and an empty piece.
  Tensor i = indices({1, 2}, {2});
  CHECK(cat({i, indices({}, {0}), i}).tolist<int64_t>() == std::vector<int64_t>{1, 2, 1, 2});
}

TEST_CASE("stack inserts a new dim") {
  Tensor a = from_vector<float>({1, 2, 3}, {3});
  Tensor b = from_vector<float>({4, 5, 6}, {3});
  CHECK(stack({a, b}).shape() == Shape{2, 3});
  CHECK(stack({a, b}).tolist<float>() == std::vector<float>{1, 2, 3, 4, 5, 6});
  CHECK(stack({a, b}, 1).shape() == Shape{3, 2});
  CHECK(stack({a, b}, -1).tolist<float>() == std::vector<float>{1, 4, 2, 5, 3, 6});
}

TEST_CASE("split, split_with_sizes and chunk return views with PyTorch's sizes") {
  Tensor x = arange(0, 10, 1, kFloat32).reshape({5, 2});
  auto pieces = split(x, 2);
  CHECK(sizes_along(pieces, 0) == std::vector<int64_t>{2, 2, 1});  // last one smaller
  CHECK(pieces[2].tolist<float>() == std::vector<float>{8, 9});
  CHECK(sizes_along(x.split(1, 1), 1) == std::vector<int64_t>{1, 1});
  CHECK(sizes_along(split_with_sizes(x, {1, 0, 4}), 0) == std::vector<int64_t>{1, 0, 4});
  // chunk: pieces of ceil(size / chunks), so possibly fewer pieces than asked.
  CHECK(sizes_along(x.chunk(2), 0) == std::vector<int64_t>{3, 2});
  CHECK(sizes_along(x.chunk(4), 0) == std::vector<int64_t>{2, 2, 1});
  CHECK(sizes_along(arange(6).chunk(4), 0) == std::vector<int64_t>{2, 2, 2});
  CHECK(sizes_along(x.chunk(9), 0) == std::vector<int64_t>{1, 1, 1, 1, 1});
  CHECK(sizes_along(zeros({0, 3}).chunk(3), 0) == std::vector<int64_t>{0, 0, 0});
  CHECK(split(zeros({0}), 2).size() == 1);
  // Huge sizes count their pieces without overflowing: one piece, the whole tensor.
  CHECK(sizes_along(split(x, std::numeric_limits<int64_t>::max()), 0) == std::vector<int64_t>{5});
  CHECK(sizes_along(x.chunk(std::numeric_limits<int64_t>::max()), 0) == std::vector<int64_t>{1, 1, 1, 1, 1});

  // Zero-copy: the pieces alias x's storage, so writes to x show through.
  Tensor y = zeros({6, 4});
  auto parts = y.chunk(3);
  for (const Tensor& p : parts) CHECK(p.storage() == y.storage());
  CHECK(parts[1].storage_offset() == 8);
  y.fill_(3);
  CHECK(parts[2].tolist<float>() == std::vector<float>(8, 3.0f));
}

TEST_CASE("index_select picks slices, repeats included, for every dtype") {
  Tensor x = arange(0, 12, 1, kFloat32).reshape({3, 4});
  Tensor rows = indices({2, 0, 2}, {3});
  CHECK(index_select(x, 0, rows).tolist<float>() == std::vector<float>{8, 9, 10, 11, 0, 1, 2, 3, 8, 9, 10, 11});
  CHECK(x.index_select(1, indices({3, 1}, {2})).tolist<float>() == std::vector<float>{3, 1, 7, 5, 11, 9});
  CHECK(x.to(kFloat64).index_select(-1, indices({0}, {1})).tolist<double>() == std::vector<double>{0, 4, 8});
  CHECK(x.to(kInt64).index_select(0, indices({1}, {1})).tolist<int64_t>() == std::vector<int64_t>{4, 5, 6, 7});
  // A strided input and a strided index.
  Tensor strided_index = indices({1, 9, 0, 9, 2}, {5}).slice(0, 0, 5, 2);  // [1, 0, 2]
  CHECK(x.t().index_select(1, strided_index).tolist<float>() ==
        std::vector<float>{4, 0, 8, 5, 1, 9, 6, 2, 10, 7, 3, 11});
  CHECK(x.index_select(0, indices({}, {0})).shape() == Shape{0, 4});
}

TEST_CASE("gather matches a naive loop, with an index smaller than the input") {
  Tensor x = arange(0, 12, 1, kFloat64).reshape({3, 4});
  Tensor idx1 = indices({3, 0, 1, 1, 2, 2}, {3, 2});
  // dim 1: out[i][j] = x[i][idx[i][j]]
  CHECK(gather(x, 1, idx1).tolist<double>() == std::vector<double>{3, 0, 5, 5, 10, 10});
  // dim 0: out[i][j] = x[idx[i][j]][j]
  Tensor idx0 = indices({2, 1, 0, 0}, {1, 4});
  CHECK(x.gather(0, idx0).tolist<double>() == std::vector<double>{8, 5, 2, 3});
  // A larger case on a transposed input, against a loop.
  Generator gen(3);
  Tensor big = randn({40, 30}, TensorOptions(kFloat64), &gen).t();  // [30, 40]
  Tensor idx = randint(0, 30, {20, 40}, TensorOptions(kInt64), &gen);
  auto got = big.gather(0, idx).tolist<double>();
  auto src = big.contiguous().tolist<double>();
  auto iv = idx.tolist<int64_t>();
  bool all = true;
  for (int64_t i = 0; i < 20; ++i)
    for (int64_t j = 0; j < 40; ++j) all = all && got[i * 40 + j] == src[iv[i * 40 + j] * 40 + j];
  CHECK(all);
}

TEST_CASE("index_add and scatter_add sum repeated indices, also when threads split the work") {
  Tensor out = zeros({3, 2});
  index_add_kernel(out.device())(out, 0, indices({0, 2, 0}, {3}), from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2}));
  CHECK(out.tolist<float>() == std::vector<float>{6, 8, 0, 0, 3, 4});
  Tensor counts = zeros({4}, kInt64);
  scatter_add_kernel(counts.device())(counts, 0, indices({1, 3, 1, 1}, {4}), ones({4}, kInt64));
  CHECK(counts.tolist<int64_t>() == std::vector<int64_t>{0, 3, 0, 1});

  // Large enough for several threads (Note [Scatter without races]); integer values, so
  // the sums are exact and any lost update would show.
  Generator gen(5);
  const int64_t rows = 64, cols = 2048, targets = 8;
  Tensor idx = randint(0, targets, {rows, cols}, TensorOptions(kInt64), &gen);
  Tensor src = randint(0, 100, {rows, cols}, TensorOptions(kInt64), &gen);
  Tensor acc = zeros({targets, cols}, kInt64);
  scatter_add_kernel(acc.device())(acc, 0, idx, src);
  std::vector<int64_t> want(static_cast<size_t>(targets * cols), 0);
  auto iv = idx.tolist<int64_t>(), sv = src.tolist<int64_t>();
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) want[iv[i * cols + j] * cols + j] += sv[i * cols + j];
  CHECK(acc.tolist<int64_t>() == want);

  Tensor slices = randint(0, 100, {rows, cols}, TensorOptions(kInt64), &gen);
  Tensor row_idx = randint(0, targets, {rows}, TensorOptions(kInt64), &gen);
  Tensor acc2 = zeros({targets, cols}, kInt64);
  index_add_kernel(acc2.device())(acc2, 0, row_idx, slices);
  std::fill(want.begin(), want.end(), 0);
  auto rv = row_idx.tolist<int64_t>(), lv = slices.tolist<int64_t>();
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) want[rv[i] * cols + j] += lv[i * cols + j];
  CHECK(acc2.tolist<int64_t>() == want);
}

TEST_CASE("gradients of cat and stack") {
  Tensor a = leaf({2, 3}, 1), b = leaf({1, 3}, 2), c = leaf({2, 2}, 3);
  gradcheck([](const auto& in) { return cat({in[0], in[1]}, 0); }, {a, b});
  gradcheck([](const auto& in) { return cat({in[0], in[1], in[0]}, 1); }, {a, c});
  // An input without grad in the middle.
  Tensor fixed = zeros({2, 1}, kFloat64);
  gradcheck([&](const auto& in) { return cat({in[0], fixed, in[1]}, 1); }, {a, c});
  Tensor d = leaf({2, 3}, 4);
  gradcheck([](const auto& in) { return stack({in[0], in[1]}, 0); }, {a, d});
  gradcheck([](const auto& in) { return stack({in[0], in[1]}, 2); }, {a, d});
}

TEST_CASE("gradients of split and chunk, also when only some pieces are used") {
  Tensor x = leaf({5, 3}, 5);
  gradcheck([](const auto& in) { return in[0].split(2)[1]; }, {x});  // the others get zeros
  gradcheck([](const auto& in) {
    auto p = in[0].split(2);
    return cat({p[2] * 3.0, p[0]}, 0);
  }, {x});
  gradcheck([](const auto& in) {
    auto p = split_with_sizes(in[0], {1, 2}, 1);
    return p[1] * p[1];
  }, {x});
  gradcheck([](const auto& in) {
    auto p = in[0].chunk(3, 0);
    return p[0] + p[1];
  }, {x});
}

TEST_CASE("pieces of a split back-propagate independently (Note [Split returns views])") {
  Tensor x = zeros({4}, kFloat64).requires_grad_(true);
  auto pieces = x.chunk(2);
  pieces[0].sum().backward();
  // Compared half by half: GCC 12.2 with -march=native on an AVX-512 machine compiles
  // some {a, a, 0, 0} vector literals into {a, a, a, a}.
  CHECK(x.grad().narrow(0, 0, 2).tolist<double>() == std::vector<double>(2, 1.0));
  CHECK(x.grad().narrow(0, 2, 2).tolist<double>() == std::vector<double>(2, 0.0));
  (pieces[1] * 2.0).sum().backward();  // a second backward() through another piece
  CHECK(x.grad().tolist<double>() == std::vector<double>{1, 1, 2, 2});
}

TEST_CASE("gradients of index_select and gather, with repeated indices") {
  Tensor x = leaf({4, 3}, 6);
  Tensor repeated = indices({1, 3, 1, 1, 0}, {5});
  gradcheck([&](const auto& in) { return index_select(in[0], 0, repeated); }, {x});
  gradcheck([&](const auto& in) { return index_select(in[0], 1, indices({2, 2, 0}, {3})); }, {x});
  Tensor idx1 = indices({0, 0, 2, 1, 1, 1, 2, 0}, {4, 2});
  gradcheck([&](const auto& in) { return gather(in[0], 1, idx1); }, {x});
  Tensor idx0 = indices({3, 3, 0, 1, 3, 2}, {2, 3});
  gradcheck([&](const auto& in) { return gather(in[0], 0, idx0); }, {x});
}

TEST_CASE("errors name the offending tensor, index, dim and size") {
  CHECK_THROWS_WITH_AS(cat({zeros({2, 3}), zeros({2, 3}), zeros({2, 4})}, 0),
                       doctest::Contains("tensor 2 has shape [2, 4] and tensor 0 has shape [2, 3]"), Error);
  CHECK_THROWS_WITH_AS(cat({zeros({2, 3}), zeros({2, 3}, kFloat64)}), doctest::Contains("tensor 1 is float64"), Error);
  CHECK_THROWS_WITH_AS(cat({zeros({2, 3}), zeros({3})}), doctest::Contains("tensor 1 has shape [3]"), Error);
  CHECK_THROWS_WITH_AS(cat({}), doctest::Contains("non-empty"), Error);
  CHECK_THROWS_WITH_AS(stack({zeros({2}), zeros({3})}), doctest::Contains("[3] at entry 1"), Error);
  CHECK_THROWS_WITH_AS(split_with_sizes(zeros({5}), {2, 2}), doctest::Contains("sum exactly to 5"), Error);
  CHECK_THROWS_WITH_AS(split(zeros({5}), 0), doctest::Contains("split_size must be positive"), Error);
  CHECK_THROWS_WITH_AS(chunk(zeros({5}), 0), doctest::Contains("positive number of chunks"), Error);

  Tensor x = zeros({3, 4});
  CHECK_THROWS_WITH_AS(index_select(x, 1, indices({0, 7}, {2})),
                       doctest::Contains("index 7 is out of bounds for dimension 1 with size 4"), Error);
  CHECK_THROWS_WITH_AS(index_select(x, 0, indices({-1}, {1})),
                       doctest::Contains("index -1 is out of bounds for dimension 0 with size 3"), Error);
  CHECK_THROWS_WITH_AS(gather(x, 0, indices({0, 3}, {1, 2})),
                       doctest::Contains("index 3 is out of bounds for dimension 0 with size 3"), Error);
  CHECK_THROWS_WITH_AS(index_select(x, 0, from_vector<float>({0}, {1})), doctest::Contains("int64 index"), Error);
  CHECK_THROWS_WITH_AS(gather(x, 0, indices({0}, {1})), doctest::Contains("as many dims"), Error);
  CHECK_THROWS_WITH_AS(gather(x, 0, indices(std::vector<int64_t>(10, 0), {2, 5})),
                       doctest::Contains("dimension 1 is 5 > 4"), Error);
  Tensor out = zeros({3});
  CHECK_THROWS_WITH_AS(index_add_kernel(out.device())(out, 0, indices({5}, {1}), ones({1})),
                       doctest::Contains("index 5 is out of bounds for dimension 0 with size 3"), Error);
  CHECK_THROWS_WITH_AS(scatter_add_kernel(out.device())(out, 0, indices({3}, {1}), ones({1})),
                       doctest::Contains("index 3 is out of bounds"), Error);
}
