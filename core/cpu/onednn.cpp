// The shared oneDNN pieces: see core/cpu/onednn.h.
#include "core/cpu/onednn.h"

#include <atomic>
#include <cstdlib>

namespace loom::cpu::onednn {

const dnnl::engine& cpu_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

namespace {
std::atomic<int64_t> g_scratchpad_bytes{0};  // the sum over threads' buffers
}  // namespace

void* scratchpad(size_t size, const char* op) {
  struct Buffer {
    void* data = nullptr;
    size_t size = 0;
    void release() {
      std::free(data);
      g_scratchpad_bytes -= static_cast<int64_t>(size);
      data = nullptr;
      size = 0;
    }
    ~Buffer() { release(); }
  };
  thread_local Buffer buffer;
  if (size > buffer.size) {
    buffer.release();
    const size_t bytes = (size + 4095) / 4096 * 4096;
    buffer.data = std::aligned_alloc(4096, bytes);
    LOOM_CHECK(buffer.data, op, ": out of CPU memory for a ", size, "-byte oneDNN scratchpad");
    buffer.size = bytes;
    g_scratchpad_bytes += static_cast<int64_t>(bytes);
  }
  return buffer.data;
}

int64_t scratchpad_bytes() { return g_scratchpad_bytes.load(); }

dnnl::memory::data_type data_type(DType dtype) {
  switch (dtype) {
    case kFloat32: return dnnl::memory::data_type::f32;
    case kBFloat16: return dnnl::memory::data_type::bf16;
    case kFloat16: return dnnl::memory::data_type::f16;
    default: break;
  }
  LOOM_FAIL("oneDNN kernels take float32, bfloat16 or float16 tensors, got ", dtype);
}

void fail(const char* file, int line, const std::string& what, const dnnl::error& e) {
  detail::throw_error(file, line,
                      detail::str(what, ": ", e.what(), " (dnnl_status_t ", static_cast<int>(e.status),
                                  "). Run with ONEDNN_VERBOSE=1 to see what oneDNN tried."));
}

}  // namespace loom::cpu::onednn
