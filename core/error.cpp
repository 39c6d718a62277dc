#include "core/error.h"

namespace loom::detail {

void throw_error(const char* file, int line, const std::string& message) {
  // Keep only the path below the source root: "core/tensor.cpp:42" reads better than
  // an absolute build path and is the same on every machine.
  std::string where = file;
  for (const char* top : {"/core/", "/autograd/", "/nn/", "/cuda/", "/parallel/", "/data/", "/examples/", "/tests/"}) {
    auto pos = where.rfind(top);
    if (pos != std::string::npos) {
      where = where.substr(pos + 1);
      break;
    }
  }
  throw Error(message + " (" + where + ":" + std::to_string(line) + ")");
}

}  // namespace loom::detail
