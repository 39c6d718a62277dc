// libFuzzer: the store server (parallel/store/store_server.h) reading arbitrary bytes
// from a client, after a valid hello. Each input is one connection: hello, the input,
// then the client closes its sending side and reads until the server closes. The server
// must neither crash nor stop serving: after every input a well-behaved client checks a
// set/get round trip. See Note [A client that misbehaves] in store_server.cpp. Run by
// tests/fuzz/run.sh.
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "core/error.h"
#include "parallel/store/protocol.h"
#include "parallel/store/socket.h"
#include "parallel/store/tcp_store.h"

using namespace loom;
using namespace loom::distributed;
using namespace std::chrono_literals;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static auto server = std::make_unique<TCPStore>("127.0.0.1", 0, /*is_server=*/true, 10s);
  static auto good = std::make_unique<TCPStore>("127.0.0.1", server->port(), false, 10s);
  {
    net::Socket raw = net::connect_to("127.0.0.1", server->port(), 5s);
    std::string bytes = protocol::Writer()
                            .u8(static_cast<uint8_t>(protocol::Command::Hello))
                            .u32(protocol::kMagic)
                            .u32(protocol::kVersion)
                            .frame();
    bytes.append(reinterpret_cast<const char*>(data), size);
    try {
      net::send_all(raw.fd(), bytes.data(), bytes.size(), "fuzz");
    } catch (const Error&) {
      // the server may close on us mid-send after refusing a frame: fine
    }
    ::shutdown(raw.fd(), SHUT_WR);  // the server sees the end, answers what it has, and closes
    char sink[4096];
    while (::recv(raw.fd(), sink, sizeof(sink), 0) > 0) {
    }
  }
  good->set("fuzz/alive", "1");
  if (good->get("fuzz/alive") != "1") std::abort();
  if (good->delete_key("fuzz/alive") != true) std::abort();
  return 0;
}
