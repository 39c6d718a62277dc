#include "nn/safetensors.h"


#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "autograd/grad_mode.h"
#include "core/atomic_file.h"  // defines: write_file_atomically, read_whole_file
#include "core/factory.h"
#include "nn/json.h"

namespace loom::safetensors {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; loom writes and reads host memory directly");

// Larger headers are refused before parsing, as the reference implementation does; a real
// header is about 100 bytes per tensor.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct DTypeName {
  DType dtype;
  const char* name;
};
constexpr DTypeName kDTypes[] = {{kFloat64, "F64"}, {kFloat32, "F32"}, {kFloat16, "F16"}, {kBFloat16, "BF16"},
                                 {kInt64, "I64"},   {kInt32, "I32"},   {kUInt8, "U8"},    {kBool, "BOOL"}};

const char* dtype_to_name(DType dtype) {
  for (const auto& d : kDTypes)
    if (d.dtype == dtype) return d.name;
  LOOM_FAIL("safetensors: dtype ", dtype, " has no safetensors name");
}


}  // namespace

// ---- writing ------------------------------------------------------------------------------

std::string serialize(const OrderedDict<Tensor>& tensors, const Metadata& metadata) {
  NoGradGuard no_grad;
  json::Value header = json::Value::Object{};
  if (!metadata.empty()) {
    json::Value meta = json::Value::Object{};
    for (const auto& [k, v] : metadata) meta.set(k, v);
    header.set("__metadata__", std::move(meta));
  }
  std::vector<Tensor> host;  // contiguous CPU copies (or the tensors themselves when already so)
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    LOOM_CHECK(name != "__metadata__", "safetensors: \"__metadata__\" is reserved and cannot name a tensor");
    LOOM_CHECK(t.defined(), "safetensors: tensor \"", name, "\" is undefined");
    Tensor h = t.detach().to(Device()).contiguous();
    json::Value shape = json::Value::Array{};
    for (int64_t size : h.shape()) shape.as_array().emplace_back(size);
    json::Value entry = json::Value::Object{};
    entry.set("dtype", dtype_to_name(h.dtype()));
    entry.set("shape", std::move(shape));
    entry.set("data_offsets",
              json::Value::Array{json::Value(static_cast<int64_t>(offset)),
                                 json::Value(static_cast<int64_t>(offset + h.nbytes()))});
    header.set(name, std::move(entry));
    offset += h.nbytes();
    host.push_back(std::move(h));
  }
  std::string text = json::dump(header);
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');  // Note [safetensors layout]: align the data
  std::string out(8, '\0');
  const uint64_t n = text.size();
  std::memcpy(out.data(), &n, 8);  // little-endian host, see the static_assert
  out += text;
  out.reserve(out.size() + offset);
  for (const Tensor& h : host) out.append(static_cast<const char*>(h.raw_data()), h.nbytes());
  return out;
}

void save_file(const OrderedDict<Tensor>& tensors, const std::string& path, const Metadata& metadata) {
  write_file_atomically(path, serialize(tensors, metadata), "safetensors");  // Note [Atomic files]
}

// ---- reading ------------------------------------------------------------------------------

namespace {

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

// One tensor's header entry, checked against the data buffer's size.
Entry parse_entry(const std::string& name, const json::Value& value, uint64_t data_size, const std::string& where) {
  auto bad = [&](const auto&... what) { LOOM_FAIL(where, ": tensor \"", name, "\": ", what...); };
  if (!value.is_object()) bad("expected an object with dtype, shape and data_offsets, got a ", json::type_name(value.type()));
  const json::Value* dtype = value.find("dtype");
  const json::Value* shape = value.find("shape");
  const json::Value* offsets = value.find("data_offsets");
  if (!dtype || !shape || !offsets) bad("missing \"", !dtype ? "dtype" : !shape ? "shape" : "data_offsets", "\"");
  if (!dtype->is_string()) bad("\"dtype\" must be a string");

  Entry e{name, kFloat32, {}, 0, 0};
  bool known = false;
  for (const auto& d : kDTypes)
    if (dtype->as_string() == d.name) e.dtype = d.dtype, known = true;
  if (!known) bad("unknown or unsupported dtype \"", dtype->as_string(), "\" (loom reads F64, F32, F16, BF16, I64, I32, U8, BOOL)");

  if (!shape->is_array()) bad("\"shape\" must be an array of sizes");
  uint64_t numel = 1;
  for (const json::Value& size : shape->as_array()) {
    if (!size.is_int() || size.as_int() < 0) bad("\"shape\" must hold non-negative integers");
    const auto s = static_cast<uint64_t>(size.as_int());
    if (s != 0 && numel > std::numeric_limits<uint64_t>::max() / 8 / s) bad("shape is too large");
    numel *= s;
    e.shape.push_back(size.as_int());
  }

  if (!offsets->is_array() || offsets->as_array().size() != 2 || !(*offsets)[0].is_int() || !(*offsets)[1].is_int())
    bad("\"data_offsets\" must be [begin, end]");
  const int64_t begin = (*offsets)[0].as_int(), end = (*offsets)[1].as_int();
  if (begin < 0 || end < begin || static_cast<uint64_t>(end) > data_size)
    bad("data_offsets [", begin, ", ", end, "] are out of range for a data buffer of ", data_size, " bytes");
  e.begin = static_cast<uint64_t>(begin);
  e.end = static_cast<uint64_t>(end);
  const uint64_t expected = numel * element_size(e.dtype);
  if (e.end - e.begin != expected)
    bad("data_offsets [", begin, ", ", end, "] span ", e.end - e.begin, " bytes, but shape ", e.shape, " of ",
        dtype->as_string(), " needs ", expected, " bytes");
  return e;
}

// The header length in `first8` (a file's first 8 bytes), checked against the `size`
// bytes of the whole file.
uint64_t header_length(std::string_view first8, uint64_t size, const std::string& where) {
  LOOM_CHECK(first8.size() >= 8 && size >= 8, where, ": file too small (", size, " bytes); a safetensors file "
             "starts with an 8-byte header length");
  uint64_t n = 0;
  std::memcpy(&n, first8.data(), 8);
  LOOM_CHECK(n <= size - 8, where, ": header length ", n, " exceeds the ", size - 8,
             " bytes that follow it (truncated file, or not a safetensors file)");
  LOOM_CHECK(n <= kMaxHeaderBytes, where, ": header length ", n, " is larger than the ", kMaxHeaderBytes,
             "-byte limit");
  return n;
}

// The JSON header (bytes 8..8+n of the file), which must be an object.
json::Value parse_header(std::string_view text, const std::string& where) {
  json::Value header;
  try {
    header = json::parse(text);
  } catch (const json::ParseError& e) {
    LOOM_FAIL(where, ": malformed JSON header: ", e.what(), " (the header is bytes 8..", 8 + text.size(),
              " of the file)");
  }
  LOOM_CHECK(header.is_object(), where, ": the header must be a JSON object, got a ", json::type_name(header.type()));
  return header;
}

// The header's "__metadata__" entry, an object of strings.
Metadata parse_metadata(const json::Value& value, const std::string& where) {
  LOOM_CHECK(value.is_object(), where, ": \"__metadata__\" must be an object of strings");
  Metadata metadata;
  for (const auto& [k, v] : value.as_object()) {
    LOOM_CHECK(v.is_string(), where, ": metadata \"", k, "\" must be a string, got a ", json::type_name(v.type()));
    metadata.insert(k, v.as_string());
  }
  return metadata;
}

}  // namespace

File deserialize(std::string_view bytes, const std::string& source, Device device) {
  const std::string where = "safetensors file '" + source + "'";
  const uint64_t n = header_length(bytes, bytes.size(), where);
  const json::Value header = parse_header(bytes.substr(8, n), where);

  const std::string_view data = bytes.substr(8 + n);
  File file;
  std::vector<Entry> entries;
  for (const auto& [name, value] : header.as_object()) {
    if (name == "__metadata__") {
      file.metadata = parse_metadata(value, where);
      continue;
    }
    entries.push_back(parse_entry(name, value, data.size(), where));
  }

  // Sorted by start, non-empty tensors overlap iff one starts before the previous ends
  // (empty ones take no bytes: left out, so that one between two others hides nothing).
  std::vector<const Entry*> by_offset;
  for (const Entry& e : entries)
    if (e.begin != e.end) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const Entry* a, const Entry* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const Entry& prev = *by_offset[i - 1];
    const Entry& cur = *by_offset[i];
    LOOM_CHECK(cur.begin >= prev.end, where, ": tensors \"", prev.name, "\" [", prev.begin, ", ", prev.end,
               ") and \"", cur.name, "\" [", cur.begin, ", ", cur.end, ") overlap in the data buffer");
  }

  for (const Entry& e : entries) {
    const char* p = data.data() + e.begin;
    if (e.dtype == kBool) {
      for (uint64_t i = 0; i < e.end - e.begin; ++i)
        LOOM_CHECK(p[i] == 0 || p[i] == 1, where, ": tensor \"", e.name, "\" is BOOL but holds byte ",
                   static_cast<int>(static_cast<unsigned char>(p[i])), " at element ", i);
    }
    file.tensors.insert(e.name, from_blob(p, e.shape, TensorOptions(e.dtype).device(device)));
  }
  return file;
}

File read_file(const std::string& path, Device device) {
  return deserialize(read_whole_file(path, "safetensors"), path, device);
}

Metadata read_metadata(const std::string& path) {
  const std::string where = "safetensors file '" + path + "'";
  std::ifstream in(path, std::ios::binary);
  LOOM_CHECK(in, "safetensors: cannot open '", path, "': ", std::strerror(errno));
  in.seekg(0, std::ios::end);
  const auto size = static_cast<uint64_t>(std::max<std::streamoff>(in.tellg(), 0));
  in.seekg(0);
  std::string first8(8, '\0');
  in.read(first8.data(), 8);
  first8.resize(static_cast<size_t>(in.gcount()));
  const uint64_t n = header_length(first8, size, where);
  std::string text(n, '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  LOOM_CHECK(static_cast<uint64_t>(in.gcount()) == n, where, ": error reading its header: ", std::strerror(errno));
  const json::Value header = parse_header(text, where);
  const json::Value* metadata = header.find("__metadata__");
  return metadata ? parse_metadata(*metadata, where) : Metadata{};
}

OrderedDict<Tensor> load_file(const std::string& path, Device device) { return read_file(path, device).tensors; }

}  // namespace loom::safetensors

namespace loom::nn {

void save(const Module& module, const std::string& path) {
  safetensors::save_file(module.state_dict(), path, {{"format", "pt"}});
}

LoadResult load(Module& module, const std::string& path, bool strict) {
  OrderedDict<Tensor> state = safetensors::load_file(path);
  try {
    return module.load_state_dict(state, strict);
  } catch (const Error& e) {
    LOOM_FAIL("loading '", path, "' into ", module.type_name(), ": ", e.what());
  }
}

}  // namespace loom::nn
