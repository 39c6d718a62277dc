// libFuzzer: the CIFAR-10 binary reader (data/cifar10.h) on an arbitrary test_batch.bin.
// Bad input (a size that is not whole records, a label outside 0..9) must be a
// loom::Error; a file that loads must give every image and label. Run by
// tests/fuzz/run.sh.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "data/cifar10.h"     // defines: CIFAR10
#include "data/sample_rng.h"  // defines: SampleRng

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace loom;
  static const std::filesystem::path root = [] {
    auto dir = std::filesystem::temp_directory_path() / ("loom_fuzz_cifar10." + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    return dir;
  }();
  {
    std::ofstream out(root / "test_batch.bin", std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    data::CIFAR10 test(root.string(), /*train=*/false);
    if (test.size() * data::CIFAR10::kRecordBytes != static_cast<int64_t>(size)) std::abort();
    for (int64_t i : {int64_t(0), test.size() - 1}) {
      if (i < 0) continue;
      data::SampleRng rng({}, i);
      auto example = test.get(i, rng);
      if (example.target < 0 || example.target > 9 || example.data.numel() != data::CIFAR10::kImageBytes) std::abort();
    }
  } catch (const Error&) {
  }
  return 0;
}
