#include "parallel/store/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <thread>

#include "parallel/system_error.h"  // defines: LOOM_CHECK_ERRNO

namespace loom::distributed::net {

using std::chrono::milliseconds;

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = other.release();
  }
  return *this;
}

void Socket::close() {
  // No retry on EINTR: on Linux the descriptor is released even when close() is
  // interrupted, and retrying could close a descriptor another thread just opened.
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::string endpoint(const std::string& host, int port) {
  bool ipv6_literal = host.find(':') != std::string::npos;
  return (ipv6_literal ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

void set_nonblocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  LOOM_CHECK_ERRNO(flags >= 0, "fcntl(F_GETFL) on socket ", fd);
  LOOM_CHECK_ERRNO(::fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0, "fcntl(F_SETFL, O_NONBLOCK) on socket ", fd);
}

static void set_blocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  LOOM_CHECK_ERRNO(flags >= 0, "fcntl(F_GETFL) on socket ", fd);
  LOOM_CHECK_ERRNO(::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) == 0, "fcntl(F_SETFL) on socket ", fd);
}

void set_nodelay(int fd) {
  int one = 1;
  LOOM_CHECK_ERRNO(::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) == 0,
                   "setsockopt(TCP_NODELAY) on socket ", fd);
}

int local_port(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  LOOM_CHECK_ERRNO(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0, "getsockname on socket ", fd);
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
}

// Binds to the wildcard address: the store must accept ranks on other nodes, which
// reach rank 0 through whatever interface MASTER_ADDR names (as PyTorch's TCPStore).
static Socket bind_wildcard(int port, int& bind_errno) {
  for (int family : {AF_INET6, AF_INET}) {
    Socket s(::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!s.valid()) {
      if (errno == EAFNOSUPPORT) continue;  // a host without IPv6: use IPv4
      LOOM_CHECK_ERRNO(false, "socket() for a listening socket on port ", port);
    }
    int one = 1, zero = 0;
    // SO_REUSEADDR lets a restarted job reuse a port whose old connections linger in
    // TIME_WAIT; it does not let two live servers share a port (that is still EADDRINUSE).
    LOOM_CHECK_ERRNO(::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0,
                     "setsockopt(SO_REUSEADDR) on port ", port);
    int rc;
    if (family == AF_INET6) {
      LOOM_CHECK_ERRNO(::setsockopt(s.fd(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero)) == 0,
                       "setsockopt(IPV6_V6ONLY=0) on port ", port);
      sockaddr_in6 addr{};
      addr.sin6_family = AF_INET6;
      addr.sin6_addr = in6addr_any;
      addr.sin6_port = htons(static_cast<uint16_t>(port));
      rc = ::bind(s.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    } else {
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_ANY);
      addr.sin_port = htons(static_cast<uint16_t>(port));
      rc = ::bind(s.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    }
    if (rc == 0) return s;
    bind_errno = errno;
    if (bind_errno == EADDRINUSE || bind_errno == EACCES) return Socket();
    if (family == AF_INET6 && bind_errno == EADDRNOTAVAIL) continue;  // IPv6 present but disabled
    LOOM_CHECK_ERRNO(false, "bind() to port ", port);
  }
  return Socket();
}

Socket listen_on(int port, int backlog) {
  LOOM_CHECK(port >= 0 && port <= 65535, "listen_on: expected a port in [0, 65535], got ", port);
  int bind_errno = 0;
  Socket s = bind_wildcard(port, bind_errno);
  if (bind_errno == EADDRINUSE)
    LOOM_FAIL("port ", port, " is already in use, so the store cannot listen on it. Another job (or a "
              "previous run that has not exited) holds it. Pick another port: set MASTER_PORT (or "
              "loomrun --master_port P, or --standalone to pick a free one)");
  if (bind_errno == EACCES)
    LOOM_FAIL("permission denied binding port ", port, ": ports below 1024 need privileges. Set MASTER_PORT "
              "to a port above 1024 (29500 is the usual default)");
  LOOM_CHECK(s.valid(), "could not bind a listening socket on port ", port, ": ", std::strerror(bind_errno));
  LOOM_CHECK_ERRNO(::listen(s.fd(), backlog) == 0, "listen() on port ", port);
  return s;
}

int find_free_port() {
  Socket s = listen_on(0, 1);
  return local_port(s.fd());
}

// One non-blocking connect attempt to one resolved address, bounded by `deadline`.
// Returns 0 and a connected socket, or the errno of the failure.
static int try_connect(const addrinfo& ai, Clock::time_point deadline, Socket& out) {
  Socket s(::socket(ai.ai_family, ai.ai_socktype | SOCK_CLOEXEC, ai.ai_protocol));
  if (!s.valid()) return errno;
  set_nonblocking(s.fd());
  int rc;
  do rc = ::connect(s.fd(), ai.ai_addr, ai.ai_addrlen);
  while (rc != 0 && errno == EINTR);
  if (rc != 0 && errno != EINPROGRESS) return errno;
  if (rc != 0) {
    pollfd p{s.fd(), POLLOUT, 0};
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    int n;
    do n = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(left, 0)));
    while (n < 0 && errno == EINTR);
    if (n < 0) return errno;
    if (n == 0) return ETIMEDOUT;
    int err = 0;
    socklen_t len = sizeof(err);
    if (::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) return errno;
    if (err != 0) return err;
  }
  set_blocking(s.fd());
  set_nodelay(s.fd());
  out = std::move(s);
  return 0;
}

Socket connect_to(const std::string& host, int port, milliseconds timeout) {
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  auto pause = milliseconds(10);
  int last_error = 0;
  std::string last_what;
  while (true) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    int gai = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
    if (gai == 0) {
      std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> list(found, &::freeaddrinfo);
      for (addrinfo* ai = found; ai; ai = ai->ai_next) {
        Socket s;
        last_error = try_connect(*ai, deadline, s);
        if (last_error == 0) return s;
        last_what = std::strerror(last_error);
      }
    } else if (gai == EAI_NONAME || gai == EAI_SERVICE || gai == EAI_FAMILY) {
      LOOM_FAIL("cannot resolve the store host '", host, "': ", ::gai_strerror(gai),
                ". Check MASTER_ADDR (it must name rank 0's machine, e.g. 127.0.0.1 on one node)");
    } else {
      last_what = ::gai_strerror(gai);  // EAI_AGAIN and friends: DNS may recover, retry
    }
    auto now = Clock::now();
    if (now >= deadline) break;
    std::this_thread::sleep_for(std::min(pause, std::chrono::duration_cast<milliseconds>(deadline - now)));
    pause = std::min(pause * 2, milliseconds(500));
  }
  auto waited = std::chrono::duration_cast<milliseconds>(Clock::now() - start).count();
  LOOM_FAIL("could not connect to the store at ", endpoint(host, port), " within ", waited, " ms (timeout ",
            timeout.count(), " ms; last error: ", last_what, "). The store is served by rank 0 at "
            "MASTER_ADDR:MASTER_PORT: check that rank 0 is running, that every rank uses the same "
            "MASTER_ADDR and MASTER_PORT, and that no firewall blocks the port; raise the timeout if rank 0 "
            "starts later than the others");
}

void send_all(int fd, const void* data, size_t n, const std::string& peer) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t sent = ::send(fd, p, n, MSG_NOSIGNAL);
    if (sent < 0 && errno == EINTR) continue;
    LOOM_CHECK_ERRNO(sent >= 0, "sending to ", peer, " failed (did its process exit?)");
    p += sent;
    n -= static_cast<size_t>(sent);
  }
}

void recv_all(int fd, void* data, size_t n, Clock::time_point deadline, const std::string& peer,
              const std::string& what) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    LOOM_CHECK(left > 0, "timed out waiting for the ", what, " from ", peer,
               ". The peer is alive but did not answer in time; it may be overloaded or stuck");
    pollfd pfd{fd, POLLIN, 0};
    int ready = ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left, 1 << 30)));
    if (ready < 0 && errno == EINTR) continue;
    LOOM_CHECK_ERRNO(ready >= 0, "poll() while waiting for the ", what, " from ", peer);
    if (ready == 0) continue;  // the deadline check above reports it
    ssize_t got = ::recv(fd, p, n, 0);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    LOOM_CHECK_ERRNO(got >= 0, "receiving the ", what, " from ", peer);
    LOOM_CHECK(got > 0, "the connection to ", peer, " closed while waiting for the ", what,
               ". The other side exited or crashed (for the store: rank 0's process, which serves it)");
    p += got;
    n -= static_cast<size_t>(got);
  }
}

namespace {

std::string numeric(const sockaddr* addr, socklen_t len) {
  char text[NI_MAXHOST] = {};
  if (::getnameinfo(addr, len, text, sizeof(text), nullptr, 0, NI_NUMERICHOST) != 0) return "";
  return text;
}

std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> lookup(const std::string& name, int flags) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  hints.ai_flags = flags;
  addrinfo* found = nullptr;
  if (::getaddrinfo(name.c_str(), nullptr, &hints, &found) != 0) found = nullptr;
  return {found, &::freeaddrinfo};
}

}  // namespace

bool is_loopback_host(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

std::vector<std::string> resolve_host(const std::string& name) {
  std::vector<std::string> addresses;
  auto list = lookup(name, 0);
  for (addrinfo* ai = list.get(); ai; ai = ai->ai_next) {
    std::string text = numeric(ai->ai_addr, ai->ai_addrlen);
    if (!text.empty()) addresses.push_back(text);
  }
  return addresses;
}

std::string local_address_toward(const std::string& host) {
  auto list = lookup(host, 0);
  for (addrinfo* ai = list.get(); ai; ai = ai->ai_next) {
    net::Socket s(::socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (!s.valid()) continue;
    // A port is needed to connect; connecting a UDP socket only consults the routes.
    reinterpret_cast<sockaddr_in*>(ai->ai_addr)->sin_port = htons(9);  // same offset in sockaddr_in6
    if (::connect(s.fd(), ai->ai_addr, ai->ai_addrlen) != 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (::getsockname(s.fd(), reinterpret_cast<sockaddr*>(&local), &len) != 0) continue;
    std::string text = numeric(reinterpret_cast<sockaddr*>(&local), len);
    if (!text.empty()) return text;
  }
  return "";
}

bool is_local_address(const std::string& address) {
  auto list = lookup(address, AI_NUMERICHOST);
  if (!list) return false;
  net::Socket s(::socket(list->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  return s.valid() && ::bind(s.fd(), list->ai_addr, list->ai_addrlen) == 0;  // port 0: any free one
}

}  // namespace loom::distributed::net
