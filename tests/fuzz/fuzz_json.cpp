// libFuzzer: nn/json.h's parser (safetensors headers, metrics files) on arbitrary bytes.
// Bad input must be a loom::Error; good input must round-trip: dump(parse(dump(v))) ==
// dump(v). Anything else -- a crash, a sanitizer report, another exception, a hang --
// is a finding. Run by tests/fuzz/run.sh.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "core/error.h"
#include "nn/json.h"  // defines: json::parse, json::dump

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace loom;
  json::Value value;
  try {
    value = json::parse(std::string_view(reinterpret_cast<const char*>(data), size));
  } catch (const Error&) {
    return 0;  // refused with a message: what bad input should get
  }
  const std::string once = json::dump(value);
  if (json::dump(json::parse(once)) != once) std::abort();  // dump must write what parse reads back
  return 0;
}
