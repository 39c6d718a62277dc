// safetensors: the checkpoint format of Hugging Face's safetensors library, which PyTorch
// users load with safetensors.torch.load_file. loom's checkpoints use it so that they move
// between loom and PyTorch (state_dict keys match too; see nn/module.h).
//
//   safetensors::save_file(model->state_dict(), "ckpt.safetensors", {{"epoch", "3"}});
//   OrderedDict<Tensor> sd = safetensors::load_file("ckpt.safetensors");
//   nn::save(*model, "model.safetensors");            // state_dict + {"format": "pt"}
//   nn::load(*model, "model.safetensors");            // load_state_dict(strict=true)
//
// Note [safetensors layout]
//   bytes 0..7      N, the header length, unsigned 64-bit little-endian
//   bytes 8..8+N    a JSON object, UTF-8, padded with trailing spaces so 8+N is a multiple
//                   of 8:  {"__metadata__": {"k": "v", ...},
//                           "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [b, e]}, ...}
//   bytes 8+N..     the data buffer: each tensor's elements, row-major, little-endian, at
//                   [b, e) relative to the buffer's start; e - b = numel * element size.
// dtypes: F64 F32 F16 BF16 I64 I32 U8 BOOL (the ones loom has). loom writes tensors in the
// order given, back to back, and the "__metadata__" entry first when there is metadata.
//
// Reading validates everything before trusting it (files come from elsewhere): a short
// file, a header length beyond the file, malformed JSON (with the byte where it broke),
// unknown dtypes, negative or absurd shapes, offsets out of range, overlapping, or not
// matching shape x dtype, bool bytes other than 0/1. Each is a loom::Error naming the
// file and the tensor; nothing is ever read out of bounds.
//
// Saving is atomic: the bytes go to "<path>.tmp.<pid>", are fsync'ed, and the temporary
// is renamed over <path>. A crash mid-save (or a full disk) leaves the previous
// checkpoint intact rather than a truncated one.
#pragma once

#include <string>
#include <string_view>

#include "core/tensor.h"
#include "nn/module.h"
#include "nn/ordered_dict.h"

namespace loom::safetensors {

using Metadata = OrderedDict<std::string>;

struct File {
  OrderedDict<Tensor> tensors;  // in header order
  Metadata metadata;
};

// The file's bytes for `tensors` (any device, dtype, layout: each is copied to host).
std::string serialize(const OrderedDict<Tensor>& tensors, const Metadata& metadata = {});
// Parses bytes produced by serialize() or by the safetensors library; `source` names the
// bytes in error messages (the path, for files). Tensors are created on `device`.
File deserialize(std::string_view bytes, const std::string& source, Device device = Device());

void save_file(const OrderedDict<Tensor>& tensors, const std::string& path, const Metadata& metadata = {});
OrderedDict<Tensor> load_file(const std::string& path, Device device = Device());
// Tensors and metadata together.
File read_file(const std::string& path, Device device = Device());
// The metadata alone, from the header: the file's data is not read (safetensors' safe_open(path).metadata()).
Metadata read_metadata(const std::string& path);

}  // namespace loom::safetensors

namespace loom::nn {

// module.state_dict() to `path`, with metadata {"format": "pt"} as safetensors.torch.save_model.
void save(const Module& module, const std::string& path);
// Loads `path` into `module` with load_state_dict(strict): values are copied into the
// module's tensors wherever they live (CPU or CUDA).
LoadResult load(Module& module, const std::string& path, bool strict = true);

}  // namespace loom::nn
