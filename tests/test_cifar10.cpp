// CIFAR10 reader: the real files where present (counts, label histograms, known pixels;
// skipped with a message elsewhere), and small synthetic files written here to check
// every validation error names the path and the problem. Also find_cifar10_root.
#include <doctest/doctest.h>

#include <array>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <unistd.h>  // defines: getpid, for a private temp dir

#include "data/cifar10.h"
#include "data/data_root.h"
#include "data/transforms.h"

using namespace loom;
using namespace loom::data;
namespace fs = std::filesystem;

namespace {

// The real data, loaded once for all the cases that use it; nullopt when absent.
std::string not_found;  // why real_root() is empty
std::optional<std::string> real_root() {
  static const std::optional<std::string> root = []() -> std::optional<std::string> {
    try {
      return find_cifar10_root(std::nullopt);
    } catch (const Error& e) {
      not_found = e.what();
      return std::nullopt;
    }
  }();
  return root;
}

std::array<int64_t, 10> histogram(const std::vector<int64_t>& targets, size_t begin, size_t end) {
  std::array<int64_t, 10> counts{};
  for (size_t i = begin; i < end; ++i) ++counts[static_cast<size_t>(targets[i])];
  return counts;
}

// A fresh directory of tiny CIFAR-format files: record r of file f has label
// (f + r) % 10 and every pixel byte equal to 10 * f + r.
struct FakeCifar {
  fs::path dir = fs::temp_directory_path() / ("loom_test_cifar10_" + std::to_string(getpid()));
  FakeCifar(int64_t records_per_file = 3) {
    fs::remove_all(dir);
    fs::create_directories(dir);
    for (size_t f = 0; f < cifar10_file_names().size(); ++f) {
      std::string bytes;
      for (int64_t r = 0; r < records_per_file; ++r) {
        bytes += static_cast<char>((static_cast<int64_t>(f) + r) % 10);
        bytes += std::string(CIFAR10::kImageBytes, static_cast<char>(10 * static_cast<int64_t>(f) + r));
      }
      write(cifar10_file_names()[f], bytes);
    }
  }
  ~FakeCifar() { fs::remove_all(dir); }
  void write(const std::string& name, const std::string& bytes) const {
    std::ofstream(dir / name, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  std::string path(const std::string& name) const { return (dir / name).string(); }
};

// The message of the loom::Error `body` throws ("" if it throws none).
template <typename F>
std::string error_of(F&& body) {
  try {
    body();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("real CIFAR-10: record counts, label histograms, known pixels") {
  if (!real_root()) {
    MESSAGE("SKIPPED: real-data checks not run. ", not_found);
    return;
  }
  MESSAGE("real CIFAR-10 at ", *real_root());
  for (const auto& name : cifar10_file_names())
    CHECK(fs::file_size(fs::path(*real_root()) / name) == 10000 * CIFAR10::kRecordBytes);

  CIFAR10 train(*real_root(), /*train=*/true);
  CIFAR10 test(*real_root(), /*train=*/false);
  CHECK(train.size() == 50000);
  CHECK(test.size() == 10000);
  std::array<int64_t, 10> all_5000, all_1000;
  all_5000.fill(5000);
  all_1000.fill(1000);
  CHECK(histogram(train.targets(), 0, 50000) == all_5000);
  CHECK(histogram(test.targets(), 0, 10000) == all_1000);
  // data_batch_1 is the first 10,000 training records.
  CHECK(histogram(train.targets(), 0, 10000) ==
        std::array<int64_t, 10>{1005, 974, 1032, 1016, 999, 937, 1030, 1001, 1025, 981});

  // First training image: a frog; its red row 0 starts 59 43 50 68 98 119 139 145.
  CHECK(CIFAR10::classes()[static_cast<size_t>(train.target(0))] == "frog");
  const uint8_t* frog = train.image(0);
  CHECK(std::vector<int>(frog, frog + 8) == std::vector<int>{59, 43, 50, 68, 98, 119, 139, 145});
  // First test image: a cat; red row 0 starts 158 159 165 166 160 156 162 159.
  CHECK(CIFAR10::classes()[static_cast<size_t>(test.target(0))] == "cat");
  const uint8_t* cat = test.image(0);
  CHECK(std::vector<int>(cat, cat + 8) == std::vector<int>{158, 159, 165, 166, 160, 156, 162, 159});

  // dataset[i] without a transform is the uint8 image, planes R, G, B.
  Example first = train[0];
  CHECK(first.data.dtype() == kUInt8);
  CHECK(first.data.shape() == Shape{3, 32, 32});
  CHECK(first.data.tolist<uint8_t>()[0] == 59);
  CHECK(first.target == 6);
  // With the test transform: (59 / 255 - mean_R) / std_R at [0, 0, 0].
  train.set_transform(std::make_shared<transforms::Compose>(transforms::ToTensor(),
                                                            transforms::Normalize({0.4914, 0.4822, 0.4465},
                                                                                  {0.2470, 0.2435, 0.2616})));
  CHECK(train[0].data.tolist<float>()[0] == (59.0f / 255.0f - 0.4914f) / 0.2470f);
}

TEST_CASE("CIFAR10 reads records in file order across the batch files") {
  FakeCifar fake(3);
  CIFAR10 train(fake.dir.string(), true);
  CIFAR10 test(fake.dir.string(), false);
  CHECK(train.size() == 15);
  CHECK(test.size() == 3);
  for (int64_t i = 0; i < 15; ++i) {
    const int64_t file = i / 3, record = i % 3;
    CHECK(train.target(i) == (file + record) % 10);
    CHECK(train.image(i)[0] == 10 * file + record);
    CHECK(train.image(i)[3071] == 10 * file + record);
  }
  CHECK(test.target(2) == (5 + 2) % 10);
  CHECK(test.image(2)[100] == 52);
  CHECK(contains(error_of([&] { (void)train.image(15); }), "index 15 is out of range for a dataset of 15"));
}

TEST_CASE("CIFAR10 refuses bad files, naming the path and the problem") {
  FakeCifar fake(2);
  const std::string root = fake.dir.string();

  SUBCASE("missing file") {
    fs::remove(fake.dir / "data_batch_4.bin");
    const std::string message = error_of([&] { CIFAR10 train(root, true); });
    CHECK(contains(message, fake.path("data_batch_4.bin")));
    CHECK(contains(message, "missing"));
    CHECK(contains(message, "train split reads data_batch_1..5.bin"));
    CHECK(contains(message, "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"));
    CHECK(contains(message, "/scripts/get_cifar10.sh"));  // the script that fetches it
    CHECK(contains(message, "--data"));
    CHECK(contains(message, "LOOM_DATA"));
    CHECK_NOTHROW(CIFAR10(root, false));  // the test split does not need it
  }
  SUBCASE("size not a multiple of 3073") {
    fake.write("data_batch_3.bin", std::string(2 * 3073 + 100, '\1'));
    const std::string message = error_of([&] { CIFAR10 train(root, true); });
    CHECK(contains(message, fake.path("data_batch_3.bin")));
    CHECK(contains(message, "6246 bytes"));
    CHECK(contains(message, "2 records and 100 bytes left over"));
  }
  SUBCASE("CIFAR-100 records are recognised") {
    fake.write("test_batch.bin", std::string(3 * 3074, '\1'));
    const std::string message = error_of([&] { CIFAR10 test(root, false); });
    CHECK(contains(message, fake.path("test_batch.bin")));
    CHECK(contains(message, "CIFAR-100"));
  }
  SUBCASE("empty file") {
    fake.write("test_batch.bin", "");
    CHECK(contains(error_of([&] { CIFAR10 test(root, false); }), "0 records and 0 bytes left over"));
  }
  SUBCASE("label out of range") {
    std::string bytes(3 * 3073, '\0');
    bytes[1 * 3073] = 12;  // record 1's label
    fake.write("data_batch_2.bin", bytes);
    const std::string message = error_of([&] { CIFAR10 train(root, true); });
    CHECK(contains(message, "record 1 (byte offset 3073)"));
    CHECK(contains(message, fake.path("data_batch_2.bin")));
    CHECK(contains(message, "label 12"));
    CHECK(contains(message, "0..9"));
  }
}

TEST_CASE("find_cifar10_root: --data, then $LOOM_DATA, then the usual places") {
  FakeCifar fake(1);
  const char* saved = std::getenv("LOOM_DATA");
  const std::optional<std::string> saved_env = saved ? std::optional<std::string>(saved) : std::nullopt;
  unsetenv("LOOM_DATA");

  CHECK(find_cifar10_root(fake.dir.string()) == fake.dir.string());
  // A torchvision-style root (the parent of cifar-10-batches-bin) works too.
  const fs::path parent = fake.dir / "parent";
  fs::create_directories(parent);
  fs::create_directory_symlink(fake.dir, parent / "cifar-10-batches-bin");
  CHECK(find_cifar10_root(parent.string()) == (parent / "cifar-10-batches-bin").string());

  // A wrong explicit path is an error naming it, never silently skipped.
  const std::string bad = (fake.dir / "nowhere").string();
  std::string message = error_of([&] { (void)find_cifar10_root(bad); });
  CHECK(contains(message, bad));
  CHECK(contains(message, "--data"));
  CHECK(contains(message, "no such directory"));
  CHECK(contains(message, "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"));
  CHECK(contains(message, "/scripts/get_cifar10.sh"));
  fs::create_directories(fake.dir / "empty");
  message = error_of([&] { (void)find_cifar10_root((fake.dir / "empty").string()); });  // exists, no files
  CHECK(contains(message, "it lacks data_batch_1.bin"));

  setenv("LOOM_DATA", fake.dir.string().c_str(), 1);
  CHECK(find_cifar10_root(std::nullopt) == fake.dir.string());
  CHECK(find_cifar10_root(std::string("")) == fake.dir.string());  // an empty flag means "not given"
  setenv("LOOM_DATA", bad.c_str(), 1);
  message = error_of([&] { (void)find_cifar10_root(std::nullopt); });
  CHECK(contains(message, "$LOOM_DATA"));
  CHECK(contains(message, bad));
  CHECK(find_cifar10_root(fake.dir.string()) == fake.dir.string());  // the flag wins over the variable
  unsetenv("LOOM_DATA");

  // Without flag or variable: the real data where it exists, else an error listing the search.
  message = error_of([&] {
    const std::string found = find_cifar10_root(std::nullopt);
    CHECK(fs::is_regular_file(fs::path(found) / "test_batch.bin"));
  });
  if (!message.empty()) {
    CHECK(contains(message, "data/cifar-10-batches-bin"));
    CHECK(contains(message, "LOOM_DATA is not set"));
  }
  if (saved_env) setenv("LOOM_DATA", saved_env->c_str(), 1);
}
