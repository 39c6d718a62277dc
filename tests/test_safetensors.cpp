// safetensors: the exact byte layout loom writes, round trips of every dtype, validation
// of corrupt files (each a loom::Error naming the file), atomic saves, Module save/load,
// and the JSON reader underneath.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>  // defines: std::signbit
#include <cstring>
#include <filesystem>
#include <fstream>

#include "nn/json.h"
#include "nn/nn.h"

using namespace loom;
namespace fs = std::filesystem;

namespace {

// A fresh directory per test, removed afterwards.
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("loom_safetensors_" + std::to_string(::getpid()) + "_" +
                                        std::to_string(counter()++));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
  static int& counter() {
    static int n = 0;
    return n;
  }
};

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A file made of a header text and a data buffer, with the length prefix.
std::string make_file(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

std::string error_loading(const std::string& path) {
  try {
    safetensors::load_file(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a file loom writes has exactly the safetensors layout") {
  OrderedDict<Tensor> tensors;
  tensors.insert("a", from_vector<float>({1.0f, 2.0f}, {2}));
  tensors.insert("b", from_vector<int64_t>({7}, {1, 1}));
  std::string bytes = safetensors::serialize(tensors, {{"format", "pt"}});
  const std::string json = R"({"__metadata__":{"format":"pt"},)"
                           R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("b":{"dtype":"I64","shape":[1,1],"data_offsets":[8,16]}})";
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  CHECK((8 + n) % 8 == 0);  // padded so the data buffer is 8-byte aligned
  CHECK(n >= json.size());
  CHECK(n < json.size() + 8);
  CHECK(bytes.substr(8, json.size()) == json);
  CHECK(bytes.substr(8 + json.size(), n - json.size()) == std::string(n - json.size(), ' '));
  REQUIRE(bytes.size() == 8 + n + 16);
  float a[2];
  int64_t b;
  std::memcpy(a, bytes.data() + 8 + n, 8);
  std::memcpy(&b, bytes.data() + 8 + n + 8, 8);
  CHECK(a[0] == 1.0f);
  CHECK(a[1] == 2.0f);
  CHECK(b == 7);
  // The first byte of the length is its low byte (little-endian).
  CHECK(static_cast<unsigned char>(bytes[0]) == (n & 0xff));
}

TEST_CASE("every dtype, scalars, empty and strided tensors round-trip through a file") {
  TempDir dir;
  OrderedDict<Tensor> tensors;
  tensors.insert("f32", randn({3, 4}));
  tensors.insert("f64", randn({2, 2}, kFloat64));
  tensors.insert("i64", from_vector<int64_t>({-5, 1LL << 40}, {2}));
  tensors.insert("i32", from_vector<int32_t>({-7, 9, 11}, {3}));
  tensors.insert("u8", from_vector<uint8_t>({0, 128, 255}, {3}));
  tensors.insert("bool", lt(from_vector<float>({1, 5}, {2}), from_vector<float>({2, 2}, {2})));
  tensors.insert("f16", from_vector<float>({0.5f, -2.0f, 1024.0f}, {3}).to(kFloat16));
  tensors.insert("bf16", from_vector<float>({0.5f, -2.0f, 3.0f}, {3}).to(kBFloat16));
  tensors.insert("scalar", scalar_tensor(3.5, kFloat64));
  tensors.insert("empty", zeros({0, 3}));
  tensors.insert("strided", arange(0, 6, 1, kFloat32).reshape({2, 3}).t());
  const std::string path = dir.file("all.safetensors");
  safetensors::save_file(tensors, path, {{"epoch", "3"}, {"note", "quote \" and\nnewline"}});
  auto file = safetensors::read_file(path);
  CHECK(file.metadata["epoch"] == "3");
  CHECK(file.metadata["note"] == "quote \" and\nnewline");
  REQUIRE(file.tensors.keys() == tensors.keys());
  for (const auto& [key, t] : tensors) {
    const std::string& name = key;  // See Note [doctest messages name no structured binding]
    const Tensor& got = file.tensors[name];
    CHECK_MESSAGE(got.shape() == t.shape(), name);
    CHECK_MESSAGE(got.dtype() == t.dtype(), name);
    if (is_floating(t.dtype())) {
      CHECK_MESSAGE(got.to(kFloat64).tolist<double>() == t.to(kFloat64).tolist<double>(), name);
    } else if (t.dtype() == kBool) {
      CHECK(got.tolist<bool>() == std::vector<bool>{true, false});
    } else {
      CHECK_MESSAGE(got.to(kInt64).tolist<int64_t>() == t.to(kInt64).tolist<int64_t>(), name);
    }
  }
  // The save went through a temporary that was renamed away.
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir.path)) entries += e.is_regular_file();
  CHECK(entries == 1);
  // Tensors can be created straight on another device.
  CHECK(safetensors::load_file(path, Device("cpu:1"))["f32"].device() == Device("cpu:1"));
}

TEST_CASE("corrupt files are loom::Errors naming the file and the problem") {
  TempDir dir;
  const std::string good_entry = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string data(8, '\0');
  struct Case {
    const char* name;
    std::string bytes;
    const char* expect;
  };
  std::string huge(8, '\0');
  uint64_t big = 1000;
  std::memcpy(huge.data(), &big, 8);
  std::vector<Case> cases = {
      {"tiny", "abc", "file too small"},
      {"long_header", huge + "{}", "exceeds the 2 bytes"},
      {"bad_json", make_file(R"({"x":{"dtype":"F32",)", data), "malformed JSON header"},
      {"not_object", make_file("[1, 2]", ""), "must be a JSON object"},
      {"unknown_dtype", make_file(R"({"x":{"dtype":"C64","shape":[2],"data_offsets":[0,8]}})", data),
       "unknown or unsupported dtype \"C64\""},
      {"out_of_range", make_file(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,12]}})", data),
       "out of range"},
      {"wrong_size", make_file(R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data),
       "needs 12 bytes"},
      {"negative_shape", make_file(R"({"x":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data),
       "non-negative"},
      {"missing_field", make_file(R"({"x":{"dtype":"F32","shape":[2]}})", data), "missing \"data_offsets\""},
      {"overlap",
       make_file(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                 R"("y":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                 data),
       "overlap"},
      // An empty tensor sorted between two that overlap hides nothing.
      {"overlap_around_empty",
       make_file(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                 R"("e":{"dtype":"F32","shape":[0],"data_offsets":[2,2]},)"
                 R"("y":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                 data),
       "\"x\" [0, 8) and \"y\" [4, 8) overlap"},
      {"bad_bool", make_file(R"({"x":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})", std::string("\x01\x07", 2)),
       "holds byte 7"},
      {"duplicate", make_file(R"({"x":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},"x":{}})", ""),
       "duplicate key \"x\""},
  };
  for (const Case& c : cases) {
    const std::string path = dir.file(std::string(c.name) + ".safetensors");
    write_bytes(path, c.bytes);
    std::string message = error_loading(path);
    CHECK_MESSAGE(message.find(path) != std::string::npos, c.name, ": ", message);
    CHECK_MESSAGE(message.find(c.expect) != std::string::npos, c.name, ": ", message);
  }
  // The JSON error says where it broke.
  write_bytes(dir.file("where.safetensors"), make_file(R"({"x": nope})", ""));
  CHECK(error_loading(dir.file("where.safetensors")).find("at byte 6") != std::string::npos);
  // Sanity: the well-formed base case loads.
  write_bytes(dir.file("good.safetensors"), make_file(good_entry, data));
  CHECK(safetensors::load_file(dir.file("good.safetensors"))["x"].shape() == Shape{2});
  // A missing file.
  std::string missing = dir.file("nope.safetensors");
  std::string message = error_loading(missing);
  CHECK(message.find(missing) != std::string::npos);
  CHECK(message.find("No such file") != std::string::npos);
}

TEST_CASE("every truncation of a valid file is an error, never a crash") {
  OrderedDict<Tensor> tensors;
  tensors.insert("w", randn({4, 4}));
  tensors.insert("n", from_vector<int64_t>({1, 2}, {2}));
  std::string bytes = safetensors::serialize(tensors);
  for (size_t len = 0; len < bytes.size(); ++len)
    CHECK_THROWS_AS(safetensors::deserialize(std::string_view(bytes).substr(0, len), "cut"), Error);
  CHECK(safetensors::deserialize(bytes, "whole").tensors.size() == 2);
}

TEST_CASE("saving over an existing file replaces it; an unwritable path says so") {
  TempDir dir;
  const std::string path = dir.file("ckpt.safetensors");
  OrderedDict<Tensor> one;
  one.insert("v", ones({2}));
  safetensors::save_file(one, path);
  one.insert("v", full({2}, 5.0));
  safetensors::save_file(one, path);
  CHECK(safetensors::load_file(path)["v"].tolist<float>() == std::vector<float>{5, 5});
  CHECK(read_bytes(path) == safetensors::serialize(one));  // the file is exactly serialize()'s bytes
  CHECK_THROWS_WITH_AS(safetensors::save_file(one, dir.file("no/such/dir/x.safetensors")),
                       doctest::Contains("no/such/dir/x.safetensors"), Error);
}

TEST_CASE("nn::save and nn::load move a model's whole state") {
  TempDir dir;
  const std::string path = dir.file("tiny.safetensors");
  manual_seed(1);
  auto a = nn::resnet_tiny(10, 4);
  a->forward(randn({2, 3, 8, 8}));  // running stats and num_batches_tracked move
  nn::save(*a, path);
  CHECK(safetensors::read_file(path).metadata["format"] == "pt");
  manual_seed(2);
  auto b = nn::resnet_tiny(10, 4);
  nn::load(*b, path);
  auto sa = a->state_dict(), sb = b->state_dict();
  for (const auto& [key, t] : sa) {
    const std::string& name = key;  // See Note [doctest messages name no structured binding]
    if (t.dtype() == kInt64) CHECK(sb[name].tolist<int64_t>() == t.tolist<int64_t>());
    else CHECK_MESSAGE(sb[name].tolist<float>() == t.tolist<float>(), name);
  }
  CHECK(b->bn1->num_batches_tracked.item<int64_t>() == 1);
  auto wrong = nn::resnet_tiny(5, 4);
  try {
    nn::load(*wrong, path);
    FAIL("expected an error");
  } catch (const Error& e) {
    std::string message = e.what();
    CHECK(message.find(path) != std::string::npos);
    CHECK(message.find("size mismatch for \"fc.weight\"") != std::string::npos);
  }
}

TEST_CASE("json: values, escapes, unicode, and errors with positions") {
  json::Value v = json::parse(R"( {"a": [1, -2, 3.5e2, true, false, null], "s": "q\"\\\/\n\u00e9\ud83d\ude00"} )");
  CHECK(v["a"][0].as_int() == 1);
  CHECK(v["a"][1].as_int() == -2);
  CHECK(v["a"][2].as_double() == 350.0);
  CHECK(v["a"][3].as_bool());
  CHECK(v["a"][5].is_null());
  CHECK(v["s"].as_string() == "q\"\\/\n\xc3\xa9\xf0\x9f\x98\x80");
  CHECK(json::parse(json::dump(v))["s"].as_string() == v["s"].as_string());
  CHECK(json::dump(json::parse(R"({"k":[1,{"x":"y"}]})")) == R"({"k":[1,{"x":"y"}]})");
  CHECK_THROWS_WITH_AS(json::parse("{\"a\": 1,}"), doctest::Contains("byte 8"), json::ParseError);
  CHECK_THROWS_WITH_AS(json::parse("[1 2]"), doctest::Contains("expected ']'"), json::ParseError);
  CHECK_THROWS_WITH_AS(json::parse("\"abc"), doctest::Contains("unterminated string"), json::ParseError);
  CHECK_THROWS_WITH_AS(json::parse("99999999999999999999"), doctest::Contains("64 bits"), json::ParseError);
  // Found by tests/fuzz/fuzz_json: an exponent that overflows a double parsed to inf,
  // which dump() then refused to write.
  CHECK_THROWS_WITH_AS(json::parse("[0, 1e336854775808]"), doctest::Contains("beyond the range of a double"),
                       json::ParseError);
  CHECK_THROWS_WITH_AS(json::parse("-1e309"), doctest::Contains("beyond the range"), json::ParseError);
  CHECK(json::parse("1e-400").as_double() == 0.0);  // underflow rounds to zero, as in Python
  // Also found by fuzz_json: a float with an integral value was written as an integer
  // ("-0" for -0.0), so it read back as an Int, and -0.0 as 0.
  CHECK(json::dump(json::parse("[-0e308, 3.0, 2.5, 1e300]")) == "[-0.0,3.0,2.5,1.0000000000000001e+300]");
  CHECK(json::parse(json::dump(json::Value(-0.0))).type() == json::Value::Type::Float);
  CHECK(std::signbit(json::parse(json::dump(json::Value(-0.0))).as_double()));
  CHECK_THROWS_WITH_AS(json::parse("{} x"), doctest::Contains("end of the document"), json::ParseError);
  CHECK_THROWS_WITH_AS(json::parse(std::string(1000, '[')), doctest::Contains("nesting deeper"), json::ParseError);
  CHECK_THROWS_WITH_AS(json::parse("\"\x01\""), doctest::Contains("control character"), json::ParseError);
  CHECK_THROWS_WITH_AS(v["missing"], doctest::Contains("no key \"missing\""), Error);
  CHECK_THROWS_WITH_AS(v["s"].as_int(), doctest::Contains("expected integer, got string"), Error);
}
