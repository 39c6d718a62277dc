// The store server against clients that misbehave (Note [A client that misbehaves] in
// parallel/store/store_server.cpp): garbage, a malformed request, a huge frame, a client
// that disconnects mid-message or while its wait is parked. The offender gets an Error
// reply and is dropped; a well-behaved client on the same server sees nothing happen.
#include <doctest/doctest.h>

#include <sys/socket.h>

#include <chrono>
#include <string>
#include <thread>

#include "core/error.h"
#include "parallel/store/protocol.h"
#include "parallel/store/socket.h"
#include "parallel/store/tcp_store.h"

using namespace loom;
using namespace loom::distributed;
using namespace std::chrono_literals;

namespace {

// A client speaking raw bytes to the server.
struct RawClient {
  net::Socket socket;
  explicit RawClient(int port) : socket(net::connect_to("127.0.0.1", port, 5s)) {}

  void send(const std::string& bytes) { net::send_all(socket.fd(), bytes.data(), bytes.size(), "store"); }
  void hello() {
    send(protocol::Writer().u8(uint8_t(protocol::Command::Hello)).u32(protocol::kMagic).u32(protocol::kVersion).frame());
    CHECK(reply_status() == protocol::Status::Ok);
  }
  // The next reply's payload.
  std::string reply() {
    char length[4];
    net::recv_all(socket.fd(), length, 4, net::Clock::now() + 5s, "store", "reply");
    std::string payload(protocol::decode_length(length), '\0');
    net::recv_all(socket.fd(), payload.data(), payload.size(), net::Clock::now() + 5s, "store", "reply");
    return payload;
  }
  protocol::Status reply_status() { return static_cast<protocol::Status>(reply().at(0)); }
  // The Error reply's message.
  std::string error() {
    std::string payload = reply();
    protocol::Reader r(payload);
    CHECK(r.u8() == uint8_t(protocol::Status::Error));
    return r.str();
  }
  // True once the server has closed this connection.
  bool closed() {
    char byte;
    try {
      net::recv_all(socket.fd(), &byte, 1, net::Clock::now() + 5s, "store", "close");
    } catch (const Error& e) {
      return std::string(e.what()).find("closed") != std::string::npos;
    }
    return false;
  }
};

// A well-behaved client on the same server still works, its parked wait included.
void check_others_unaffected(TCPStore& good, const std::string& tag) {
  std::thread setter([&] {
    std::this_thread::sleep_for(50ms);
    TCPStore other("127.0.0.1", good.port(), false, 5s);
    other.set("ready/" + tag, "1");
  });
  good.wait({"ready/" + tag}, 5s);
  setter.join();
  good.set("k/" + tag, "v");
  CHECK(good.get("k/" + tag) == "v");
  CHECK(good.add("counter", 1) >= 1);
}

}  // namespace

TEST_CASE("garbage before the hello: the client is told it is not a loom client, the others go on") {
  TCPStore server("127.0.0.1", 0, true, 5s);
  TCPStore good("127.0.0.1", server.port(), false, 5s);
  RawClient http(server.port());
  http.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n");  // "GET " reads as a 542 MB frame
  CHECK(http.error().find("first message was not loom's hello") != std::string::npos);
  CHECK(http.closed());
  check_others_unaffected(good, "http");

  RawClient wrong(server.port());  // a small frame, but not a hello
  wrong.send(protocol::Writer().u8(uint8_t(protocol::Command::Get)).str("k").frame());
  CHECK(wrong.error().find("not loom's hello") != std::string::npos);
  CHECK(wrong.closed());
  check_others_unaffected(good, "wrong");
}

TEST_CASE("a malformed request, a huge frame, an unknown command: an Error reply; only that client is dropped") {
  TCPStore server("127.0.0.1", 0, true, 5s);
  TCPStore good("127.0.0.1", server.port(), false, 5s);
  const int64_t keys = good.num_keys();

  RawClient truncated(server.port());
  truncated.hello();
  // Set whose key claims 1000 bytes and has 3.
  truncated.send(protocol::Writer().u8(uint8_t(protocol::Command::Set)).u32(1000).u8('a').u8('b').u8('c').frame());
  std::string why = truncated.error();
  CHECK_MESSAGE(why.find("malformed request") != std::string::npos, why);
  CHECK(truncated.closed());
  CHECK(good.num_keys() == keys);  // nothing half-applied

  RawClient huge(server.port());
  huge.hello();
  huge.send(std::string("\xff\xff\xff\x7f", 4));  // 2 GiB announced
  CHECK(huge.error().find("over the limit") != std::string::npos);
  CHECK(huge.closed());

  RawClient unknown(server.port());  // a newer client's command: refused, connection kept
  unknown.hello();
  unknown.send(protocol::Writer().u8(200).frame());
  CHECK(unknown.error().find("unknown store command 200") != std::string::npos);
  unknown.send(protocol::Writer().u8(uint8_t(protocol::Command::NumKeys)).frame());
  CHECK(unknown.reply_status() == protocol::Status::Ok);

  check_others_unaffected(good, "malformed");
}

TEST_CASE("a client that disconnects mid-message, or with a wait parked, leaves the server serving") {
  TCPStore server("127.0.0.1", 0, true, 5s);
  TCPStore good("127.0.0.1", server.port(), false, 5s);
  {
    RawClient half(server.port());
    half.hello();
    std::string frame = protocol::Writer().u8(uint8_t(protocol::Command::Set)).str("half").str("value").frame();
    half.send(frame.substr(0, frame.size() / 2));
    std::this_thread::sleep_for(50ms);
  }  // closes mid-frame
  {
    RawClient waiter(server.port());
    waiter.hello();
    waiter.send(protocol::Writer().u8(uint8_t(protocol::Command::Wait)).strings({"later"}).i64(5000).frame());
    std::this_thread::sleep_for(50ms);
  }  // closes with its wait parked
  {
    RawClient reset(server.port());
    reset.hello();
    reset.send(std::string("\x10\x00\x00\x00\x02", 5));  // a Set frame's first byte
    linger no_linger{1, 0};
    ::setsockopt(reset.socket.fd(), SOL_SOCKET, SO_LINGER, &no_linger, sizeof(no_linger));
  }  // closes with a TCP reset
  std::this_thread::sleep_for(50ms);
  good.set("later", "1");  // settles the dead client's wait: nothing to reply to
  CHECK_FALSE(good.check({"half"}));  // the half-sent set was never applied
  check_others_unaffected(good, "disconnect");
}
