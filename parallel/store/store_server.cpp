#include "parallel/store/store_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <list>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "parallel/store/protocol.h"
#include "parallel/store/socket.h"
#include "parallel/system_error.h"  // defines: LOOM_CHECK_ERRNO

namespace loom::distributed {

using namespace protocol;
using Clock = std::chrono::steady_clock;

// Note [A client that misbehaves]
// One server serves the whole job, so no client may take it down: not one that sends
// garbage, announces a huge frame, stops mid-frame, or disconnects at any byte. Such a
// client gets an Error reply saying what was wrong (when it still reads) and its
// connection is closed, with any wait it had parked; every other connection and every
// key is untouched. A frame must be complete before it is handled, so a client that
// disconnects mid-message never half-applies a request. Before the hello, a frame may
// be at most kMaxHelloBytes: a foreign protocol's first bytes (an HTTP "GET ") read as a
// length of half a gigabyte, which the server must not wait for. Exceptions from a
// request (a malformed field, an allocation that fails) end that client only.
//
// Note [Waiting on the server]
// wait(keys, timeout) is a request the server answers late: it parks the request as a
// Waiter and replies Ok as soon as a set/add makes every key exist, or Timeout (with
// the missing keys) when its deadline passes. Clients therefore never poll, a wait
// costs one round trip, and the timeout is measured in one place. The client keeps
// its own, slightly longer deadline only to notice a server that died.

namespace {

struct Connection {
  uint64_t id;
  net::Socket socket;
  std::string in;   // bytes received, not yet a whole frame
  std::string out;  // reply bytes the socket did not accept yet
  bool greeted = false;
};

struct Waiter {
  uint64_t connection;
  std::vector<std::string> keys;
  Clock::time_point deadline;
};

// Values are bytes; a message quoting one shows the printable ones and \xNN for the rest.
std::string printable(const std::string& bytes) {
  std::string out;
  for (unsigned char ch : bytes) {
    if (ch >= 0x20 && ch < 0x7f) {
      out.push_back(static_cast<char>(ch));
    } else {
      char hex[5];
      std::snprintf(hex, sizeof(hex), "\\x%02x", ch);
      out += hex;
    }
  }
  return out;
}

}  // namespace

struct StoreServer::Loop {
  net::Socket listener;
  int port = 0;
  int wake[2] = {-1, -1};  // self-pipe: the destructor writes one byte to stop the loop
  std::unordered_map<std::string, std::string> data;
  std::list<Connection> connections;
  std::list<Waiter> waiters;
  uint64_t next_id = 0;
  std::thread thread;

  void run();
  void accept_all();
  bool read_from(Connection& c);     // false: close the connection
  bool flush(Connection& c);         // false: close the connection
  bool refuse(Connection& c, const std::string& why);  // replies Error(why); false: close it
  void handle(Connection& c, const std::string& payload);
  void reply(Connection& c, const Writer& w) { c.out += w.frame(); }
  bool all_present(const std::vector<std::string>& keys) const;
  void settle_waiters(Clock::time_point now);
  int poll_timeout_ms(Clock::time_point now) const;
  Connection* find(uint64_t id);
};

StoreServer::StoreServer(int port) : loop_(std::make_unique<Loop>()) {
  loop_->listener = net::listen_on(port);
  loop_->port = net::local_port(loop_->listener.fd());
  net::set_nonblocking(loop_->listener.fd());
  LOOM_CHECK_ERRNO(::pipe2(loop_->wake, O_CLOEXEC | O_NONBLOCK) == 0, "pipe2() for the store server's wake-up");
  loop_->thread = std::thread([loop = loop_.get()] { loop->run(); });
}

StoreServer::~StoreServer() {
  char byte = 1;
  ssize_t rc;
  do rc = ::write(loop_->wake[1], &byte, 1);
  while (rc < 0 && errno == EINTR);
  if (rc != 1) std::perror("loom: waking the store server thread failed");  // the join below would hang
  loop_->thread.join();
  ::close(loop_->wake[0]);
  ::close(loop_->wake[1]);
}

int StoreServer::port() const { return loop_->port; }

void StoreServer::Loop::run() {
  try {
    while (true) {
      std::vector<pollfd> fds = {{wake[0], POLLIN, 0}, {listener.fd(), POLLIN, 0}};
      for (auto& c : connections)
        fds.push_back({c.socket.fd(), static_cast<short>(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
      int n = ::poll(fds.data(), fds.size(), poll_timeout_ms(Clock::now()));
      if (n < 0 && errno == EINTR) continue;
      LOOM_CHECK_ERRNO(n >= 0, "poll() in the store server on port ", port);
      if (fds[0].revents) return;  // shutting down; Sockets close themselves
      if (fds[1].revents & POLLIN) accept_all();
      size_t i = 2;
      for (auto it = connections.begin(); it != connections.end() && i < fds.size(); ++i) {
        Connection& c = *it;
        bool keep = true;
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) keep = read_from(c);
        if (keep && !c.out.empty()) keep = flush(c);
        if (keep) {
          ++it;
        } else {
          waiters.remove_if([&](const Waiter& w) { return w.connection == c.id; });
          it = connections.erase(it);
        }
      }
      settle_waiters(Clock::now());
      for (auto& c : connections)
        if (!c.out.empty()) flush(c);  // a closed peer shows up as POLLHUP next round
    }
  } catch (const std::exception& e) {
    // Nothing above the thread could catch this; clients will see their connections
    // close and report that the store went away, and this line says why.
    std::fprintf(stderr, "loom: the store server on port %d stopped: %s\n", port, e.what());
  }
}

void StoreServer::Loop::accept_all() {
  while (true) {
    int fd = ::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0 && errno == EINTR) continue;
    if (fd < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == ECONNABORTED)) return;
    LOOM_CHECK_ERRNO(fd >= 0, "accept() on the store port ", port);
    connections.push_back(Connection{next_id++, net::Socket(fd), {}, {}, false});
    net::set_nodelay(fd);
  }
}

bool StoreServer::Loop::read_from(Connection& c) {
  char buffer[64 * 1024];
  while (true) {
    ssize_t got = ::recv(c.socket.fd(), buffer, sizeof(buffer), 0);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (got <= 0) return false;  // orderly close or reset (mid-frame too): the client is gone
    c.in.append(buffer, static_cast<size_t>(got));
  }
  // Handle every complete frame; a partial one waits in c.in for the next read.
  // See Note [A client that misbehaves].
  size_t pos = 0;
  while (c.in.size() - pos >= 4) {
    uint32_t length = decode_length(c.in.data() + pos);
    const uint32_t limit = c.greeted ? kMaxFrameBytes : kMaxHelloBytes;
    if (length > limit) {
      return refuse(c, c.greeted ? "a frame of " + std::to_string(length) + " bytes is over the limit of " +
                                       std::to_string(kMaxFrameBytes)
                                 : "this port serves a loom store, and the first message was not loom's hello "
                                   "(is the client something else, or pointed at the wrong MASTER_PORT?)");
    }
    if (c.in.size() - pos - 4 < length) break;
    std::string payload = c.in.substr(pos + 4, length);
    pos += 4 + length;
    try {
      handle(c, payload);
    } catch (const std::exception& e) {
      // A malformed request (or one too large to serve): this client is told why and
      // dropped, rather than guessing at the rest of its bytes; the others go on.
      return refuse(c, std::string("malformed request: ") + e.what());
    }
    if (!c.greeted) {
      flush(c);  // best effort: deliver the hello's refusal before closing
      return false;
    }
  }
  c.in.erase(0, pos);
  return true;
}

bool StoreServer::Loop::refuse(Connection& c, const std::string& why) {
  reply(c, Writer().u8(static_cast<uint8_t>(Status::Error)).str("store server: " + why));
  flush(c);  // best effort: a client that stopped reading loses the explanation, not the server
  return false;
}

bool StoreServer::Loop::flush(Connection& c) {
  while (!c.out.empty()) {
    ssize_t sent = ::send(c.socket.fd(), c.out.data(), c.out.size(), MSG_NOSIGNAL);
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;  // POLLOUT resumes
    if (sent < 0) return false;
    c.out.erase(0, static_cast<size_t>(sent));
  }
  return true;
}

void StoreServer::Loop::handle(Connection& c, const std::string& payload) {
  Reader r(payload);
  auto command = static_cast<Command>(r.u8());
  if (!c.greeted) {
    // The first frame must be Hello with our magic and version; see protocol.h.
    if (command != Command::Hello || r.u32() != kMagic) {
      reply(c, Writer().u8(static_cast<uint8_t>(Status::Error))
                   .str("store server: this port serves a loom store, and the first message was not loom's hello "
                        "(is the client something else, or pointed at the wrong MASTER_PORT?)"));
      return;
    }
    uint32_t version = r.u32();
    if (version != kVersion) {
      reply(c, Writer().u8(static_cast<uint8_t>(Status::Error))
                   .str("store protocol version " + std::to_string(version) + " is not the server's " +
                        std::to_string(kVersion) + "; run the same loom build on every rank"));
      return;
    }
    c.greeted = true;
    reply(c, Writer().u8(static_cast<uint8_t>(Status::Ok)).u32(kMagic));
    return;
  }
  Writer w;
  switch (command) {
    case Command::Set: {
      std::string key = r.str();
      data[key] = r.str();
      w.u8(static_cast<uint8_t>(Status::Ok));
      break;
    }
    case Command::Get: {
      auto it = data.find(r.str());
      if (it == data.end()) w.u8(static_cast<uint8_t>(Status::NotFound));
      else w.u8(static_cast<uint8_t>(Status::Ok)).str(it->second);
      break;
    }
    case Command::Add: {
      // Counters are stored as decimal text, as in PyTorch's TCPStore, so get() of a
      // counter returns "3" and a value set as "3" can be added to.
      std::string key = r.str();
      int64_t delta = r.i64();
      std::string& value = data[key];
      int64_t current = 0;
      if (!value.empty()) {
        try {
          size_t used = 0;
          current = std::stoll(value, &used);
          if (used != value.size()) throw std::invalid_argument(value);
        } catch (const std::exception&) {
          w.u8(static_cast<uint8_t>(Status::Error))
              .str("the key holds '" + printable(value.substr(0, 32)) + "', which is not an integer");
          break;
        }
      }
      int64_t sum = 0;
      if (__builtin_add_overflow(current, delta, &sum)) {
        w.u8(static_cast<uint8_t>(Status::Error))
            .str("adding " + std::to_string(delta) + " to " + std::to_string(current) + " overflows an int64");
        break;
      }
      value = std::to_string(sum);
      w.u8(static_cast<uint8_t>(Status::Ok)).i64(sum);
      break;
    }
    case Command::Wait: {
      Waiter waiter{c.id, r.strings(), {}};
      // Clamped so that a huge timeout cannot overflow the clock arithmetic.
      const int64_t timeout_ms = std::clamp<int64_t>(r.i64(), 0, int64_t(365) * 24 * 3600 * 1000);
      waiter.deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
      waiters.push_back(std::move(waiter));  // answered by settle_waiters, maybe at once
      return;
    }
    case Command::Check:
      w.u8(static_cast<uint8_t>(Status::Ok)).u8(all_present(r.strings()) ? 1 : 0);
      break;
    case Command::Delete:
      w.u8(static_cast<uint8_t>(Status::Ok)).u8(data.erase(r.str()) ? 1 : 0);
      break;
    case Command::NumKeys:
      w.u8(static_cast<uint8_t>(Status::Ok)).i64(static_cast<int64_t>(data.size()));
      break;
    default:
      w.u8(static_cast<uint8_t>(Status::Error)).str("unknown store command " + std::to_string(int(command)));
  }
  reply(c, w);
}

bool StoreServer::Loop::all_present(const std::vector<std::string>& keys) const {
  return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return data.count(k) > 0; });
}

Connection* StoreServer::Loop::find(uint64_t id) {
  for (auto& c : connections)
    if (c.id == id) return &c;
  return nullptr;
}

// Answers every parked wait whose keys now exist or whose deadline has passed.
void StoreServer::Loop::settle_waiters(Clock::time_point now) {
  for (auto it = waiters.begin(); it != waiters.end();) {
    bool ready = all_present(it->keys);
    if (!ready && now < it->deadline) {
      ++it;
      continue;
    }
    if (Connection* c = find(it->connection)) {
      Writer w;
      if (ready) {
        w.u8(static_cast<uint8_t>(Status::Ok));
      } else {
        std::vector<std::string> missing;
        for (const auto& k : it->keys)
          if (!data.count(k)) missing.push_back(k);
        w.u8(static_cast<uint8_t>(Status::Timeout)).strings(missing);
      }
      reply(*c, w);
    }
    it = waiters.erase(it);
  }
}

int StoreServer::Loop::poll_timeout_ms(Clock::time_point now) const {
  if (waiters.empty()) return -1;
  auto first = std::min_element(waiters.begin(), waiters.end(),
                                [](const Waiter& a, const Waiter& b) { return a.deadline < b.deadline; });
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(first->deadline - now).count() + 1;
  return static_cast<int>(std::clamp<int64_t>(ms, 0, 1 << 30));
}

}  // namespace loom::distributed
