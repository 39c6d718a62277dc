// libFuzzer: loading a safetensors file (nn/safetensors.h's deserialize, which load_file
// and read_file use) from arbitrary bytes. Bad input must be a loom::Error; a file that
// loads must serialize and load again to the same names and byte size. Run by
// tests/fuzz/run.sh.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "core/error.h"
#include "nn/safetensors.h"  // defines: safetensors::deserialize, serialize

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace loom;
  safetensors::File file;
  try {
    file = safetensors::deserialize(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz input");
  } catch (const Error&) {
    return 0;
  }
  safetensors::File again = safetensors::deserialize(safetensors::serialize(file.tensors, file.metadata), "round trip");
  if (again.tensors.size() != file.tensors.size()) std::abort();
  for (const auto& [name, tensor] : file.tensors) {
    const Tensor* other = again.tensors.find(name);
    if (!other || other->numel() != tensor.numel() || other->dtype() != tensor.dtype()) std::abort();
  }
  return 0;
}
