// The store's wire format: length-prefixed binary frames.
//
//   frame    = u32 length | payload           (length counts the payload only)
//   request  = u8 command | arguments
//   reply    = u8 status  | results
//   integers = little-endian; strings = u32 length | bytes (binary-safe)
//
//   command      arguments                       ok-reply results
//   Hello        u32 magic, u32 version          u32 magic
//   Set          key, value                      -
//   Get          key                             value            (NotFound if absent)
//   Add          key, i64 delta                  i64 new value
//   Wait         u32 n, n keys, i64 timeout ms   -                (Timeout: u32 n, missing keys)
//   Check        u32 n, n keys                   u8 all present
//   Delete       key                             u8 existed
//   NumKeys      -                               i64 count
//
// Wait is answered by the server when the keys exist or its timeout passes, so a
// client never has to poll (see Note [Waiting on the server] in store_server.cpp).
// Hello opens every connection: a client that reached something other than a loom
// store (a web server on MASTER_PORT, an old loom) fails with a message saying so.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::distributed::protocol {

constexpr uint32_t kMagic = 0x4d4f4f4c;  // "LOOM" read as little-endian bytes
constexpr uint32_t kVersion = 1;
// A frame larger than this is a corrupt length (or a foreign client), not a real value.
constexpr uint32_t kMaxFrameBytes = 1u << 30;
// Hello is 9 bytes; a first frame larger than this is not a loom client.
constexpr uint32_t kMaxHelloBytes = 64;

enum class Command : uint8_t { Hello = 1, Set, Get, Add, Wait, Check, Delete, NumKeys };
enum class Status : uint8_t { Ok = 0, NotFound = 1, Timeout = 2, Error = 3 };

const char* command_name(Command command);

// Builds one frame: write the fields, then take frame() (length prefix included).
class Writer {
 public:
  Writer& u8(uint8_t v);
  Writer& u32(uint32_t v);
  Writer& i64(int64_t v);
  Writer& str(const std::string& v);
  Writer& strings(const std::vector<std::string>& v);
  std::string frame() const;

 private:
  std::string payload_;
};

// Reads the fields of one payload in order; running past its end is a loom::Error
// (a malformed frame), never an out-of-bounds read.
class Reader {
 public:
  explicit Reader(const std::string& payload) : data_(payload) {}
  uint8_t u8();
  uint32_t u32();
  int64_t i64();
  std::string str();
  std::vector<std::string> strings();
  bool done() const { return pos_ == data_.size(); }

 private:
  const char* take(size_t n);
  const std::string& data_;
  size_t pos_ = 0;
};

// Decodes a frame's u32 length prefix.
uint32_t decode_length(const char* four_bytes);

}  // namespace loom::distributed::protocol
