#include "parallel/store/tcp_store.h"

#include <algorithm>

#include "core/error.h"
#include "parallel/store/protocol.h"
#include "parallel/store/store_server.h"

namespace loom::distributed {

using namespace protocol;
using std::chrono::milliseconds;

// The client's own reply deadline is the server-side timeout plus this slack: long
// enough that the server always answers first (with the missing keys), short enough
// that a dead server is noticed. See Note [Waiting on the server] in store_server.cpp.
constexpr milliseconds kReplySlack = std::chrono::seconds(5);

static std::string key_list(const std::vector<std::string>& keys) {
  std::string out = "[";
  for (size_t i = 0; i < keys.size(); ++i) out += (i ? ", '" : "'") + keys[i] + "'";
  return out + "]";
}

TCPStore::TCPStore(std::string host, int port, bool is_server, milliseconds timeout)
    : host_(std::move(host)), port_(port), timeout_(timeout) {
  LOOM_CHECK(timeout.count() > 0, "TCPStore: the timeout must be positive, got ", timeout.count(), " ms");
  if (is_server) {
    server_ = std::make_unique<StoreServer>(port);
    port_ = server_->port();
  }
  LOOM_CHECK(port_ > 0 && port_ <= 65535, "TCPStore: expected a port in [1, 65535] for a client, got ", port_,
             " (MASTER_PORT)");
  std::lock_guard<std::mutex> lock(mutex_);
  connect_locked();
}

TCPStore::~TCPStore() {
  socket_.close();  // first, so the server (if ours) sees this client leave
  server_.reset();
}

std::string TCPStore::peer() const { return "the store at " + net::endpoint(host_, port_); }

// Note [A broken store connection is replaced]
// A request that fails half-way (a reply that came too late, a reset) leaves bytes of
// it in flight, so the connection can no longer tell which reply is whose. It is closed
// and the next request opens a fresh one; the error of the failed request is reported.
std::string TCPStore::roundtrip(const std::string& frame, milliseconds reply_within, const std::string& what) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!socket_.valid()) connect_locked();
  return exchange_locked(frame, reply_within, what);
}

std::string TCPStore::exchange_locked(const std::string& frame, milliseconds reply_within, const std::string& what) {
  try {
    net::send_all(socket_.fd(), frame.data(), frame.size(), peer());
    auto deadline = net::Clock::now() + reply_within;
    char header[4];
    net::recv_all(socket_.fd(), header, 4, deadline, peer(), "reply to " + what);
    uint32_t length = decode_length(header);
    LOOM_CHECK(length <= kMaxFrameBytes && length >= 1, peer(), " sent a malformed reply (length ", length, ")");
    std::string payload(length, '\0');
    net::recv_all(socket_.fd(), payload.data(), length, deadline, peer(), "reply to " + what);
    return payload;
  } catch (...) {
    socket_.close();  // See Note [A broken store connection is replaced]
    throw;
  }
}

void TCPStore::connect_locked() {
  socket_ = net::connect_to(host_, port_, timeout_);
  std::string reply = exchange_locked(
      Writer().u8(static_cast<uint8_t>(Command::Hello)).u32(kMagic).u32(kVersion).frame(),
      std::min(timeout_, milliseconds(std::chrono::seconds(30))), "greeting");
  Reader r(reply);
  auto status = static_cast<Status>(r.u8());
  if (status == Status::Error) LOOM_FAIL("store at ", peer(), " refused this client: ", r.str());
  LOOM_CHECK(status == Status::Ok && r.u32() == kMagic, "the service at ", peer(),
             " answered, but it is not a loom store. Is another program using MASTER_PORT? Pick another port");
}

// A reply whose status is not Ok (and not one the caller handles) is the server's
// explanation of a refused request.
static Reader expect_ok(const std::string& payload, const std::string& what) {
  Reader r(payload);
  auto status = static_cast<Status>(r.u8());
  if (status == Status::Error) LOOM_FAIL("store ", what, " failed: ", r.str());
  LOOM_CHECK(status == Status::Ok, "store ", what, ": unexpected reply status ", int(status));
  return r;
}

void TCPStore::set(const std::string& key, const std::string& value) {
  auto reply = roundtrip(Writer().u8(static_cast<uint8_t>(Command::Set)).str(key).str(value).frame(), timeout_,
                         "set('" + key + "')");
  expect_ok(reply, "set('" + key + "')");
}

std::string TCPStore::get(const std::string& key) {
  wait({key});
  std::string what = "get('" + key + "')";
  auto reply = roundtrip(Writer().u8(static_cast<uint8_t>(Command::Get)).str(key).frame(), timeout_, what);
  Reader r(reply);
  auto status = static_cast<Status>(r.u8());
  LOOM_CHECK(status != Status::NotFound, "store ", what, ": the key existed a moment ago but was deleted before it "
             "could be read; another rank called delete_key on it");
  LOOM_CHECK(status == Status::Ok, "store ", what, ": unexpected reply status ", int(status));
  std::string value = r.str();
  return value;
}

int64_t TCPStore::add(const std::string& key, int64_t delta) {
  std::string what = "add('" + key + "', " + std::to_string(delta) + ")";
  auto reply = roundtrip(Writer().u8(static_cast<uint8_t>(Command::Add)).str(key).i64(delta).frame(), timeout_, what);
  return expect_ok(reply, what).i64();
}

void TCPStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void TCPStore::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  std::string what = "wait(" + key_list(keys) + ")";
  auto frame = Writer().u8(static_cast<uint8_t>(Command::Wait)).strings(keys).i64(timeout.count()).frame();
  auto reply = roundtrip(frame, timeout + kReplySlack, what);
  Reader r(reply);
  auto status = static_cast<Status>(r.u8());
  if (status == Status::Timeout)
    LOOM_FAIL("store ", what, " timed out after ", timeout.count(), " ms; still missing: ", key_list(r.strings()),
              ". The rank that should set them has not got there: it may have crashed, be slower than the "
              "timeout, or be waiting for something else (check its output)");
  LOOM_CHECK(status == Status::Ok, "store ", what, ": unexpected reply status ", int(status));
}

bool TCPStore::check(const std::vector<std::string>& keys) {
  std::string what = "check(" + key_list(keys) + ")";
  auto reply = roundtrip(Writer().u8(static_cast<uint8_t>(Command::Check)).strings(keys).frame(), timeout_, what);
  return expect_ok(reply, what).u8() != 0;
}

bool TCPStore::delete_key(const std::string& key) {
  std::string what = "delete_key('" + key + "')";
  auto reply = roundtrip(Writer().u8(static_cast<uint8_t>(Command::Delete)).str(key).frame(), timeout_, what);
  return expect_ok(reply, what).u8() != 0;
}

int64_t TCPStore::num_keys() {
  auto reply = roundtrip(Writer().u8(static_cast<uint8_t>(Command::NumKeys)).frame(), timeout_, "num_keys()");
  return expect_ok(reply, "num_keys()").i64();
}

}  // namespace loom::distributed
