#include "parallel/store/protocol.h"

#include "core/error.h"

namespace loom::distributed::protocol {

const char* command_name(Command command) {
  switch (command) {
    case Command::Hello: return "hello";
    case Command::Set: return "set";
    case Command::Get: return "get";
    case Command::Add: return "add";
    case Command::Wait: return "wait";
    case Command::Check: return "check";
    case Command::Delete: return "delete_key";
    case Command::NumKeys: return "num_keys";
  }
  return "unknown";
}

// Integers go out byte by byte in a fixed order so that ranks on machines of either
// endianness agree on the bytes.
static void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

static uint64_t get_le(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

Writer& Writer::u8(uint8_t v) { payload_.push_back(static_cast<char>(v)); return *this; }
Writer& Writer::u32(uint32_t v) { put_le(payload_, v, 4); return *this; }
Writer& Writer::i64(int64_t v) { put_le(payload_, static_cast<uint64_t>(v), 8); return *this; }

Writer& Writer::str(const std::string& v) {
  LOOM_CHECK(v.size() < kMaxFrameBytes, "store: a key or value of ", v.size(), " bytes is larger than the ",
             kMaxFrameBytes, "-byte frame limit; the store is for small rendezvous data, not tensors");
  u32(static_cast<uint32_t>(v.size()));
  payload_ += v;
  return *this;
}

Writer& Writer::strings(const std::vector<std::string>& v) {
  u32(static_cast<uint32_t>(v.size()));
  for (const auto& s : v) str(s);
  return *this;
}

std::string Writer::frame() const {
  LOOM_CHECK(payload_.size() <= kMaxFrameBytes, "store: message of ", payload_.size(),
             " bytes exceeds the frame limit of ", kMaxFrameBytes, " bytes");
  std::string out;
  out.reserve(4 + payload_.size());
  put_le(out, payload_.size(), 4);
  out += payload_;
  return out;
}

uint32_t decode_length(const char* four_bytes) { return static_cast<uint32_t>(get_le(four_bytes, 4)); }

const char* Reader::take(size_t n) {
  LOOM_CHECK(n <= data_.size() - pos_, "store protocol: malformed message (wanted ", n, " more bytes at offset ",
             pos_, " of a ", data_.size(), "-byte payload); both sides must run the same loom version");
  const char* p = data_.data() + pos_;
  pos_ += n;
  return p;
}

uint8_t Reader::u8() { return static_cast<uint8_t>(*take(1)); }
uint32_t Reader::u32() { return static_cast<uint32_t>(get_le(take(4), 4)); }
int64_t Reader::i64() { return static_cast<int64_t>(get_le(take(8), 8)); }

std::string Reader::str() {
  uint32_t n = u32();
  const char* p = take(n);
  return std::string(p, n);
}

std::vector<std::string> Reader::strings() {
  uint32_t n = u32();
  LOOM_CHECK(n <= data_.size() - pos_, "store protocol: malformed key list (", n, " keys in ",
             data_.size() - pos_, " bytes)");
  std::vector<std::string> out;
  out.reserve(n);
  for (uint32_t i = 0; i < n; ++i) out.push_back(str());
  return out;
}

}  // namespace loom::distributed::protocol
