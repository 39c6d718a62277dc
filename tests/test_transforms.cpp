// Transforms: each one against hand-computed values, its random draws, and the fused
// uint8 -> batch path against the reference chain, bit for bit. Ends with a throughput
// measurement of the augmentation path (printed, loosely checked).
#include <doctest/doctest.h>

#include <chrono>
#include <set>

#include "core/factory.h"
#include "data/image_dataset.h"
#include "data/in_memory_loader.h"  // defines: flips_image (the speedrun loader's rule)
#include "data/synthetic_cifar.h"
#include "data/transforms.h"

using namespace loom;
using namespace loom::data;
using namespace loom::data::transforms;

namespace {

// The CIFAR-10 recipe: statistics of the training set.
const std::vector<double> kMean = {0.4914, 0.4822, 0.4465};
const std::vector<double> kStd = {0.2470, 0.2435, 0.2616};

TransformPtr cifar_train_transform() {
  return std::make_shared<Compose>(RandomCrop(32, 4), RandomHorizontalFlip(), ToTensor(), Normalize(kMean, kStd));
}

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
  return v;
}

// A 1 x 4 x 4 uint8 image holding 1..16, row-major.
Tensor ramp_image() {
  std::vector<uint8_t> values(16);
  for (int i = 0; i < 16; ++i) values[static_cast<size_t>(i)] = static_cast<uint8_t>(i + 1);
  return from_vector(values, {1, 4, 4});
}

}  // namespace

TEST_CASE("ToTensor scales uint8 to [0, 1] and makes CHW") {
  Tensor chw = from_vector<uint8_t>({0, 51, 255, 102, 1, 2, 3, 4}, {2, 2, 2});
  CHECK_THROWS_AS(ToTensor()(chw), Error);  // 2 channels: CHW or HWC? Auto refuses to guess
  Tensor x = ToTensor(ToTensor::Layout::CHW)(chw);
  CHECK(x.dtype() == kFloat32);
  CHECK(x.shape() == Shape{2, 2, 2});
  CHECK(x.tolist<float>() == std::vector<float>{0.0f, 0.2f, 1.0f, 0.4f, 1 / 255.0f, 2 / 255.0f, 3 / 255.0f, 4 / 255.0f});
  // HWC [2, 2, 3] (numpy layout) -> [3, 2, 2]: channel planes gathered from interleaved pixels.
  Tensor hwc = from_vector<uint8_t>({10, 20, 30, 11, 21, 31, 12, 22, 32, 13, 23, 33}, {2, 2, 3});
  Tensor y = ToTensor()(hwc);
  CHECK(y.shape() == Shape{3, 2, 2});
  std::vector<float> expected;
  for (int c : {10, 20, 30})
    for (int p = 0; p < 4; ++p) expected.push_back(static_cast<float>(c + p) / 255.0f);
  CHECK(y.tolist<float>() == expected);
  CHECK(ToTensor()(from_vector<uint8_t>({255, 0}, {1, 2})).shape() == Shape{1, 1, 2});
  CHECK_THROWS_AS(ToTensor()(zeros({3, 2, 2})), Error);                // float input
  CHECK_THROWS_AS(ToTensor()(zeros({5, 7, 9}, kUInt8)), Error);        // no channel dim
  CHECK(ToTensor(ToTensor::Layout::HWC)(zeros({3, 7, 3}, kUInt8)).shape() == Shape{3, 3, 7});
}

TEST_CASE("Normalize subtracts the mean and divides by the std per channel") {
  Tensor x = from_vector<float>({0.5f, 1.0f, 0.0f, 0.25f}, {2, 1, 2});
  Tensor y = Normalize({0.5, 0.25}, {0.25, 0.5})(x);
  CHECK(y.tolist<float>() == std::vector<float>{0.0f, 2.0f, -0.5f, 0.0f});
  CHECK(Normalize({0.5}, {0.5})(x).tolist<float>() == std::vector<float>{0.0f, 1.0f, -1.0f, -0.5f});
  // Batched input [N, C, H, W] normalizes each image's channels.
  Tensor batch = from_vector<float>({1, 1, 2, 2}, {2, 2, 1, 1});
  CHECK(Normalize({1, 2}, {1, 2})(batch).tolist<float>() == std::vector<float>{0, -0.5f, 1, 0});
  // The CIFAR statistics on a known pixel value: (59/255 - 0.4914) / 0.2470.
  Tensor pixel = ToTensor()(from_vector<uint8_t>({59, 59, 59}, {3, 1, 1}));
  const float expected = (59.0f / 255.0f - 0.4914f) / 0.2470f;
  CHECK(Normalize(kMean, kStd)(pixel).tolist<float>()[0] == expected);
  CHECK(expected == doctest::Approx(-1.0528).epsilon(1e-3));
  CHECK_THROWS_AS(Normalize({0.5, 0.5}, {0.5, 0.0}), Error);
  CHECK_THROWS_AS(Normalize({0.5, 0.5}, {0.5}), Error);
  CHECK_THROWS_AS(Normalize({0.5, 0.5}, {0.5, 0.5})(zeros({3, 2, 2})), Error);  // 3 channels, 2 values
  CHECK_THROWS_AS(Normalize({0.5}, {0.5})(zeros({3, 2, 2}, kUInt8)), Error);    // before ToTensor
}

TEST_CASE("RandomHorizontalFlip mirrors the width with probability p") {
  Tensor x = from_vector<float>({1, 2, 3, 4, 5, 6}, {1, 2, 3});
  CHECK(RandomHorizontalFlip(1.0)(x).tolist<float>() == std::vector<float>{3, 2, 1, 6, 5, 4});
  CHECK(RandomHorizontalFlip(0.0)(x).tolist<float>() == std::vector<float>{1, 2, 3, 4, 5, 6});
  CHECK(RandomHorizontalFlip(1.0)(from_vector<uint8_t>({7, 8}, {1, 1, 2})).tolist<uint8_t>() == std::vector<uint8_t>{8, 7});
  RandomHorizontalFlip half;
  int flips = 0;
  for (int64_t i = 0; i < 10000; ++i) {
    SampleRng rng(AugmentSeed{1, 0}, i);
    flips += half.flips(rng) ? 1 : 0;
  }
  CHECK(flips > 4800);
  CHECK(flips < 5200);
  CHECK_THROWS_AS(RandomHorizontalFlip(1.5), Error);
}

TEST_CASE("RandomCrop pads with zeros and cuts the drawn window") {
  const Tensor image = ramp_image();  // 1..16 in a 4x4 grid
  RandomCrop crop(4, /*padding=*/2);
  CHECK(crop.output_shape({1, 4, 4}) == Shape{1, 4, 4});
  // Find samples whose window is a corner or the centre and check them by hand.
  std::set<std::pair<int64_t, int64_t>> windows;
  for (int64_t i = 0; i < 400; ++i) {
    SampleRng probe(AugmentSeed{9, 0}, i);
    const auto w = crop.get_params(probe, 8, 8);
    windows.insert({w.top, w.left});
    SampleRng rng(AugmentSeed{9, 0}, i);
    const auto got = crop(image, rng).tolist<uint8_t>();
    CHECK(rng.draws() == 2);  // top, then left
    if (w.top == 0 && w.left == 0)
      CHECK(got == std::vector<uint8_t>{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 0, 0, 5, 6});
    if (w.top == 4 && w.left == 4)
      CHECK(got == std::vector<uint8_t>{11, 12, 0, 0, 15, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0});
    if (w.top == 2 && w.left == 2)
      CHECK(got == std::vector<uint8_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16});
    if (w.top == 3 && w.left == 1)  // one row down, one column left of centre
      CHECK(got == std::vector<uint8_t>{0, 5, 6, 7, 0, 9, 10, 11, 0, 13, 14, 15, 0, 0, 0, 0});
  }
  CHECK(windows.size() == 25);  // every offset 0..4 x 0..4 occurs
  // A window the size of the padded image needs no draw; a non-square crop; a fill.
  SampleRng rng(AugmentSeed{}, 0);
  CHECK(RandomCrop(6, 1)(image, rng).shape() == Shape{1, 6, 6});
  CHECK(rng.draws() == 0);
  CHECK(RandomCrop({2, 3}, 0)(image).shape() == Shape{1, 2, 3});
  CHECK(RandomCrop(6, 1, /*fill=*/255)(image).tolist<uint8_t>()[0] == 255);
  CHECK_THROWS_AS(RandomCrop(9, 2)(image), Error);  // larger than the padded 8x8
  CHECK_THROWS_AS(RandomCrop(4, 1, /*fill=*/300)(image), Error);
}

TEST_CASE("RandomCrop with padding_mode reflect mirrors the image about its edge pixel") {
  const Tensor image = ramp_image();  // 1..16 in a 4x4 grid
  RandomCrop crop(4, /*padding=*/2, /*fill=*/0, PaddingMode::reflect);
  int corners = 0;
  for (int64_t i = 0; i < 400; ++i) {
    SampleRng probe(AugmentSeed{9, 0}, i);
    const auto w = crop.get_params(probe, 8, 8);
    SampleRng rng(AugmentSeed{9, 0}, i);
    const auto got = crop(image, rng).tolist<uint8_t>();
    CHECK(rng.draws() == 2);  // the same draws as the constant padding: top, then left
    // Padded row -2 reads row 2, -1 reads row 1 (torch.nn.functional.pad(x, 2, "reflect")).
    if (w.top == 0 && w.left == 0) {
      ++corners;
      CHECK(got == std::vector<uint8_t>{11, 10, 9, 10, 7, 6, 5, 6, 3, 2, 1, 2, 7, 6, 5, 6});
    }
    if (w.top == 4 && w.left == 4)
      CHECK(got == std::vector<uint8_t>{11, 12, 11, 10, 15, 16, 15, 14, 11, 12, 11, 10, 7, 8, 7, 6});
  }
  CHECK(corners > 0);
  CHECK_THROWS_AS(RandomCrop(4, 4, 0, PaddingMode::reflect)(image), Error);  // no mirror image 4 wide in 4 pixels
  CHECK(crop.repr() == "RandomCrop(size=(4, 4), padding=2, padding_mode=reflect)");
}

TEST_CASE("AlternatingHorizontalFlip: one coin per image, inverted every odd epoch, no draws of its own") {
  const Tensor x = from_vector<uint8_t>({1, 2, 3}, {1, 1, 3});
  AlternatingHorizontalFlip flip;
  int mirrored = 0;
  for (int64_t i = 0; i < 2000; ++i) {
    SampleRng e0(AugmentSeed{7, 0}, i), e1(AugmentSeed{7, 1}, i), e2(AugmentSeed{7, 2}, i), e5(AugmentSeed{7, 5}, i);
    const bool first = flip(x, e0).tolist<uint8_t>()[0] == 3;
    CHECK(e0.draws() == 0);  // the coin comes from its own stream, so later transforms draw as without it
    CHECK((flip(x, e1).tolist<uint8_t>()[0] == 3) == !first);
    CHECK((flip(x, e2).tolist<uint8_t>()[0] == 3) == first);
    CHECK((flip(x, e5).tolist<uint8_t>()[0] == 3) == !first);
    // The same rule as the speedrun's in-memory loader.
    CHECK(first == data::flips_image(data::Flip::alternating, 7, 0, i));
    mirrored += first ? 1 : 0;
  }
  CHECK(mirrored > 900);
  CHECK(mirrored < 1100);
}

TEST_CASE("reflect padding and the alternating flip run through the reference path, as it computes them") {
  for (const TransformPtr& transform :
       {TransformPtr(std::make_shared<Compose>(RandomCrop(32, 2, 0, PaddingMode::reflect), RandomHorizontalFlip(),
                                               ToTensor())),
        TransformPtr(std::make_shared<Compose>(RandomCrop(32, 4), AlternatingHorizontalFlip(), ToTensor()))}) {
    SyntheticCIFAR dataset(8, /*seed=*/2, transform);
    CHECK_FALSE(dataset.uses_fused_path());  // the fused gather knows neither
    Batch batch = dataset.get_batch(iota(8), {11, 1});
    Batch reference = dataset.Dataset::get_batch(iota(8), {11, 1});
    CHECK(batch.data.tolist<float>() == reference.data.tolist<float>());
  }
}

TEST_CASE("transforms print as torchvision prints them") {
  auto t = cifar_train_transform();
  CHECK(t->repr() ==
        "Compose(\n    RandomCrop(size=(32, 32), padding=4)\n    RandomHorizontalFlip(p=0.5)\n    ToTensor()\n"
        "    Normalize(mean=[0.4914, 0.4822, 0.4465], std=[0.247, 0.2435, 0.2616])\n)");
  CHECK(t->output_shape({3, 32, 32}) == Shape{3, 32, 32});
}

TEST_CASE("augmentation is a pure function of (seed, epoch, index)") {
  SyntheticCIFAR dataset(16, /*seed=*/1, cifar_train_transform());
  auto indices = iota(16);
  Batch a = dataset.get_batch(indices, {7, 3});
  Batch b = dataset.get_batch(indices, {7, 3});
  CHECK(a.data.tolist<float>() == b.data.tolist<float>());
  CHECK(a.data.tolist<float>() != dataset.get_batch(indices, {7, 4}).data.tolist<float>());
  CHECK(a.data.tolist<float>() != dataset.get_batch(indices, {8, 3}).data.tolist<float>());
  // Sample 5 alone, or inside another batch in another position: the same values.
  Batch alone = dataset.get_batch(std::vector<int64_t>{5}, {7, 3});
  std::vector<float> all = a.data.tolist<float>(), five = alone.data.tolist<float>();
  CHECK(std::vector<float>(all.begin() + 5 * 3072, all.begin() + 6 * 3072) == five);
}

TEST_CASE("the fused path equals the reference chain bit for bit") {
  std::vector<std::pair<std::string, TransformPtr>> chains = {
      {"CIFAR train", cifar_train_transform()},
      {"CIFAR test", std::make_shared<Compose>(ToTensor(), Normalize(kMean, kStd))},
      {"ToTensor", std::make_shared<ToTensor>()},
      {"crop only", std::make_shared<Compose>(RandomCrop(32, 4), ToTensor())},
      {"flip only", std::make_shared<Compose>(RandomHorizontalFlip(0.5), ToTensor(), Normalize({0.5}, {0.25}))},
      {"smaller crop", std::make_shared<Compose>(RandomCrop(24, 0), RandomHorizontalFlip(), ToTensor())},
      {"larger crop", std::make_shared<Compose>(RandomCrop(36, 4), RandomHorizontalFlip(), ToTensor())},
      {"odd crop, fill", std::make_shared<Compose>(RandomCrop({30, 27}, 3, 7), RandomHorizontalFlip(0.7), ToTensor(),
                                                   Normalize(kMean, kStd))},
      {"nested", std::make_shared<Compose>(Compose(RandomCrop(32, 4), RandomHorizontalFlip()),
                                           Compose(ToTensor(), Normalize(kMean, kStd)))},
  };
  const auto indices = iota(64);
  for (const auto& [key, transform] : chains) {
    const std::string& name = key;  // See Note [doctest messages name no structured binding]
    CAPTURE(name);
    SyntheticCIFAR dataset(64, /*seed=*/2, transform);
    CHECK(dataset.uses_fused_path());
    Batch fused = dataset.get_batch(indices, {11, 5});
    Batch reference = dataset.Dataset::get_batch(indices, {11, 5});  // get() per example, then stack
    CHECK(fused.data.shape() == reference.data.shape());
    CHECK(fused.data.tolist<float>() == reference.data.tolist<float>());
    CHECK(fused.target.tolist<int64_t>() == reference.target.tolist<int64_t>());
  }
  // Chains the loop does not cover still work, through the reference path.
  SyntheticCIFAR flip_first(4, 2, std::make_shared<Compose>(RandomHorizontalFlip(), RandomCrop(32, 4), ToTensor()));
  CHECK_FALSE(flip_first.uses_fused_path());
  CHECK(flip_first.get_batch(iota(4), {}).data.shape() == Shape{4, 3, 32, 32});
  SyntheticCIFAR raw(4, 2);
  CHECK_FALSE(raw.uses_fused_path());
  CHECK(raw.get_batch(iota(4), {}).data.dtype() == kUInt8);
  CHECK_THROWS_AS(SyntheticCIFAR(4, 2, std::make_shared<RandomCrop>(40, 2)), Error);  // refused at construction
}

TEST_CASE("augmentation throughput (fused path, one thread)") {
  SyntheticCIFAR dataset(4096, /*seed=*/3, cifar_train_transform());
  const int64_t batch_size = 128;
  auto measure = [&](bool fused) {
    using clock = std::chrono::steady_clock;
    int64_t images = 0;
    const auto start = clock::now();
    double seconds = 0;
    for (int64_t epoch = 0; seconds < 1.0; ++epoch) {
      for (int64_t first = 0; first < dataset.size(); first += batch_size) {
        std::vector<int64_t> indices = iota(batch_size);
        for (auto& i : indices) i += first;
        Batch batch = fused ? dataset.get_batch(indices, {0, epoch}) : dataset.Dataset::get_batch(indices, {0, epoch});
        images += batch.size();
      }
      seconds = std::chrono::duration<double>(clock::now() - start).count();
    }
    return static_cast<double>(images) / seconds;
  };
  const double fused = measure(true), reference = measure(false);
  MESSAGE("augmentation (RandomCrop 32 pad 4 + flip + ToTensor + Normalize -> float batch), one thread: fused ",
          static_cast<int64_t>(fused), " img/s, reference chain ", static_cast<int64_t>(reference), " img/s");
  CHECK(fused > 5000);  // loose: training consumes a few thousand img/s per device at most
}
