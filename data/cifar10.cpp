#include "data/cifar10.h"

#include <filesystem>
#include <fstream>

#include "data/data_root.h"  // defines: cifar10_file_names, cifar10_download_hint

namespace loom::data {

namespace fs = std::filesystem;

namespace {

// Appends one batch file's records to `records`, refusing anything that isn't a whole
// number of well-formed CIFAR-10 records.
void read_batch_file(const fs::path& path, bool train, ImageData& records) {
  std::error_code error;
  LOOM_CHECK(fs::is_regular_file(path, error), "CIFAR10: missing file ", path.string(), " (the ",
             train ? "train split reads data_batch_1..5.bin" : "test split reads test_batch.bin", ").\n",
             cifar10_download_hint());
  const auto bytes = static_cast<int64_t>(fs::file_size(path, error));
  LOOM_CHECK(!error, "CIFAR10: cannot read the size of ", path.string(), ": ", error.message());
  const int64_t remainder = bytes % CIFAR10::kRecordBytes;
  LOOM_CHECK(bytes > 0 && remainder == 0, "CIFAR10: ", path.string(), " is ", bytes, " bytes, not a whole number of ",
             CIFAR10::kRecordBytes, "-byte records (1 label byte + 3072 pixel bytes): ", bytes / CIFAR10::kRecordBytes,
             " records and ", remainder, " bytes left over",
             bytes % 3074 == 0 && bytes > 0 ? ". Its size fits 3074-byte records: is this CIFAR-100 (2 label bytes)?"
                                            : ". The file is truncated or not CIFAR-10's binary version; download it again");

  std::vector<uint8_t> buffer(static_cast<size_t>(bytes));
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(buffer.data()), bytes);
  LOOM_CHECK(in.gcount() == bytes, "CIFAR10: read only ", in.gcount(), " of ", bytes, " bytes from ", path.string());

  const int64_t count = bytes / CIFAR10::kRecordBytes;
  const size_t first = records.targets.size();
  records.targets.resize(first + static_cast<size_t>(count));
  records.pixels.resize((first + static_cast<size_t>(count)) * CIFAR10::kImageBytes);
  for (int64_t r = 0; r < count; ++r) {
    const uint8_t* record = buffer.data() + r * CIFAR10::kRecordBytes;
    LOOM_CHECK(record[0] < CIFAR10::kNumClasses, "CIFAR10: record ", r, " (byte offset ", r * CIFAR10::kRecordBytes,
               ") of ", path.string(), " has label ", int(record[0]), "; CIFAR-10 labels are 0..9. The file is corrupt "
               "or not CIFAR-10's binary version");
    records.targets[first + static_cast<size_t>(r)] = record[0];
    std::copy(record + 1, record + CIFAR10::kRecordBytes,
              records.pixels.begin() + static_cast<std::ptrdiff_t>((first + static_cast<size_t>(r)) * CIFAR10::kImageBytes));
  }
}

ImageData read_split(const std::string& root, bool train) {
  const auto& names = cifar10_file_names();  // data_batch_1..5.bin, test_batch.bin
  ImageData records;
  for (size_t i = train ? 0 : 5; i < (train ? 5 : 6); ++i) read_batch_file(fs::path(root) / names[i], train, records);
  return records;
}

}  // namespace

CIFAR10::CIFAR10(const std::string& root, bool train, transforms::TransformPtr transform)
    : ImageDataset("CIFAR10", {3, 32, 32}, read_split(root, train), std::move(transform)),
      root_(root),
      train_(train) {}

const std::vector<std::string>& CIFAR10::classes() {
  static const std::vector<std::string> names = {"airplane", "automobile", "bird",  "cat",  "deer",
                                                 "dog",      "frog",       "horse", "ship", "truck"};
  return names;
}

}  // namespace loom::data
