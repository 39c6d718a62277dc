// Checked TCP socket helpers shared by the store server, its clients and loomrun.
//
// Every call here retries on EINTR (a signal arriving mid-call is not an error) and
// loops over partial reads/writes (a stream socket may move fewer bytes than asked).
// Sockets are written with MSG_NOSIGNAL: a peer that went away is reported as an error
// naming the peer, not as a SIGPIPE that silently kills the process.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

namespace loom::distributed::net {

using Clock = std::chrono::steady_clock;

// An owned file descriptor: closed on destruction, movable, not copyable.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& other) noexcept : fd_(other.release()) {}
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { close(); }

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { int fd = fd_; fd_ = -1; return fd; }
  void close();

 private:
  int fd_ = -1;
};

// A listening socket on every interface (IPv6 dual-stack where available, else IPv4)
// at `port`; port 0 lets the kernel pick a free one (see local_port). A port that is
// taken is a loom::Error that names it and suggests another MASTER_PORT.
Socket listen_on(int port, int backlog = 128);

// Connects to host:port, retrying refused/unreachable attempts with a growing pause
// until `timeout` has passed: the server (rank 0) may simply not have started yet.
Socket connect_to(const std::string& host, int port, std::chrono::milliseconds timeout);

// The port a bound socket ended up on.
int local_port(int fd);

// A port that was free a moment ago (bind to port 0, read it back, close). Another
// process may take it before you bind it; prefer listen_on(0) where you can.
int find_free_port();

void set_nonblocking(int fd);
void set_nodelay(int fd);  // small request/response messages must not wait for Nagle

// Writes all n bytes (blocking socket).
void send_all(int fd, const void* data, size_t n, const std::string& peer);

// Reads exactly n bytes, waiting at most until `deadline`. `what` names the exchange in
// errors ("reply to wait([...])"). The peer closing the connection is an error that
// says so.
void recv_all(int fd, void* data, size_t n, Clock::time_point deadline, const std::string& peer,
              const std::string& what);

// "host:port", with IPv6 literals bracketed.
std::string endpoint(const std::string& host, int port);

// "localhost", "127.x.y.z", "::1" (names are not looked up, except "localhost").
bool is_loopback_host(const std::string& host);

// The addresses `name` resolves to (getaddrinfo, as numeric strings), in resolver order;
// empty when it does not resolve.
std::vector<std::string> resolve_host(const std::string& name);

// Whether `address` (numeric) is assigned to one of this machine's interfaces.
bool is_local_address(const std::string& address);

// The local address the kernel would send from to reach `host` (a UDP socket connected to
// it: no packet leaves); "" when `host` does not resolve or no route leads to it.
std::string local_address_toward(const std::string& host);

}  // namespace loom::distributed::net
