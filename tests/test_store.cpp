// TCPStore: the rendezvous key-value store. Every test serves its own store on a port
// the kernel picks (port 0), so tests running in parallel never collide.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <limits>
#include <thread>
#include <vector>

#include "core/error.h"
#include "parallel/store/protocol.h"
#include "parallel/store/socket.h"
#include "parallel/store/tcp_store.h"

using namespace loom;
using namespace loom::distributed;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

static double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

TEST_CASE("protocol frames round-trip and refuse truncated payloads") {
  std::string frame = protocol::Writer().u8(7).u32(123456).i64(-42).str(std::string("a\0b", 3)).strings({"x", ""}).frame();
  REQUIRE(protocol::decode_length(frame.data()) == frame.size() - 4);
  std::string payload = frame.substr(4);
  protocol::Reader r(payload);
  CHECK(r.u8() == 7);
  CHECK(r.u32() == 123456);
  CHECK(r.i64() == -42);
  CHECK(r.str() == std::string("a\0b", 3));
  CHECK(r.strings() == std::vector<std::string>{"x", ""});
  CHECK(r.done());
  std::string truncated = payload.substr(0, 6);
  protocol::Reader bad(truncated);
  bad.u8();
  CHECK_THROWS_WITH_AS(bad.i64(), doctest::Contains("malformed"), Error);
}

TEST_CASE("set, get, add, check, delete_key and num_keys") {
  TCPStore store("127.0.0.1", 0, /*is_server=*/true, 5s);
  CHECK(store.port() > 0);
  store.set("a", "1");
  store.set("bytes", std::string("\0\xff\n", 3));
  CHECK(store.get("a") == "1");
  CHECK(store.get("bytes") == std::string("\0\xff\n", 3));
  CHECK(store.add("a", 4) == 5);  // a counter set as text can be added to
  CHECK(store.add("counter", 2) == 2);
  CHECK(store.add("counter", -3) == -1);
  CHECK(store.get("counter") == "-1");
  CHECK(store.check({"a", "counter"}));
  CHECK_FALSE(store.check({"a", "missing"}));
  CHECK(store.num_keys() == 3);
  CHECK(store.delete_key("a"));
  CHECK_FALSE(store.delete_key("a"));
  CHECK(store.num_keys() == 2);
  CHECK_THROWS_WITH_AS(store.add("bytes", 1), doctest::Contains("not an integer"), Error);
  CHECK(store.add("counter", 1) == 0);  // the connection still works after a refused request
  CHECK(store.add("big", std::numeric_limits<int64_t>::max()) == std::numeric_limits<int64_t>::max());
  CHECK_THROWS_WITH_AS(store.add("big", 1), doctest::Contains("overflows an int64"), Error);
  CHECK(store.add("big", 0) == std::numeric_limits<int64_t>::max());  // unchanged
}

TEST_CASE("get blocks until another client sets the key") {
  TCPStore server("127.0.0.1", 0, true, 5s);
  std::thread setter([port = server.port()] {
    TCPStore client("127.0.0.1", port, false, 5s);
    std::this_thread::sleep_for(200ms);
    client.set("late", "here");
  });
  auto start = Clock::now();
  CHECK(server.get("late") == "here");
  CHECK(seconds_since(start) >= 0.15);
  setter.join();
}

TEST_CASE("wait times out naming the missing keys, and the client stays usable") {
  TCPStore store("127.0.0.1", 0, true, 5s);
  store.set("present", "x");
  auto start = Clock::now();
  CHECK_THROWS_WITH_AS(store.wait({"present", "absent"}, 300ms), doctest::Contains("still missing: ['absent']"), Error);
  double waited = seconds_since(start);
  CHECK(waited >= 0.25);
  CHECK(waited < 2.0);
  store.set_timeout(200ms);
  CHECK_THROWS_WITH_AS(store.get("never"), doctest::Contains("timed out after 200 ms"), Error);
  CHECK(store.get("present") == "x");
}

TEST_CASE("many clients in threads: atomic add and wait for everyone") {
  TCPStore server("127.0.0.1", 0, true, 10s);
  constexpr int kClients = 8, kAdds = 50;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      try {
        TCPStore client("127.0.0.1", server.port(), false, 10s);
        for (int i = 0; i < kAdds; ++i) client.add("total", 1);
        client.set("done/" + std::to_string(c), "1");
        std::vector<std::string> everyone;
        for (int k = 0; k < kClients; ++k) everyone.push_back("done/" + std::to_string(k));
        client.wait(everyone);
        if (client.get("total") != std::to_string(kClients * kAdds)) ++failures;
      } catch (const std::exception& e) {
        MESSAGE(e.what());
        ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(failures == 0);
  CHECK(server.add("total", 0) == kClients * kAdds);
}

TEST_CASE("a port already in use is an error naming it and suggesting MASTER_PORT") {
  TCPStore first("127.0.0.1", 0, true, 5s);
  std::string port = std::to_string(first.port());
  CHECK_THROWS_WITH_AS(TCPStore("127.0.0.1", first.port(), true, 5s),
                       doctest::Contains(("port " + port + " is already in use").c_str()), Error);
  CHECK_THROWS_WITH_AS(TCPStore("127.0.0.1", first.port(), true, 5s), doctest::Contains("MASTER_PORT"), Error);
}

TEST_CASE("connecting to a port nobody serves fails fast with a teaching message") {
  int dead_port = net::find_free_port();
  auto start = Clock::now();
  std::string message;
  try {
    TCPStore client("127.0.0.1", dead_port, false, 400ms);
  } catch (const Error& e) {
    message = e.what();
  }
  CHECK(seconds_since(start) < 2.0);
  CHECK(message.find("127.0.0.1:" + std::to_string(dead_port)) != std::string::npos);
  CHECK(message.find("400 ms") != std::string::npos);
  CHECK(message.find("rank 0") != std::string::npos);
  CHECK_THROWS_WITH_AS(TCPStore("no-such-host.invalid", dead_port, false, 400ms), doctest::Contains("MASTER_ADDR"),
                       Error);
}

TEST_CASE("a client learns promptly when the server goes away") {
  auto server = std::make_unique<TCPStore>("127.0.0.1", 0, true, 10s);
  TCPStore client("127.0.0.1", server->port(), false, 10s);
  std::string message;
  std::thread waiter([&] {
    try {
      client.wait({"never"}, 10s);
    } catch (const Error& e) {
      message = e.what();
    }
  });
  std::this_thread::sleep_for(100ms);
  auto start = Clock::now();
  server.reset();  // the server thread shuts down cleanly, closing every connection
  waiter.join();
  CHECK(seconds_since(start) < 2.0);
  CHECK(message.find("closed") != std::string::npos);
}
