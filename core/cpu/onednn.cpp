// The shared oneDNN pieces: see core/cpu/onednn.h.
#include "core/cpu/onednn.h"

namespace loom::cpu::onednn {

const dnnl::engine& cpu_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

Tensor workspace(const dnnl::memory::desc& desc) {
  return empty({static_cast<int64_t>(desc.get_size())}, TensorOptions(kUInt8));
}

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
