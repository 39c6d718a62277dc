#include "parallel/comm/gloo_address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>

#include "parallel/store/socket.h"  // defines: net::Socket

namespace loom::distributed {

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

// See Note [Which address a rank gives Gloo].
GlooAddress choose_gloo_address(const char* ifname, const std::string& master_addr) {
  if (ifname != nullptr && *ifname != '\0') {
    std::string first = ifname;
    first = first.substr(0, first.find(','));
    return {.iface = first, .hostname = "", .why = "the interface GLOO_SOCKET_IFNAME names"};
  }
  if (is_loopback_host(master_addr)) return {.iface = "", .hostname = "127.0.0.1", .why = "MASTER_ADDR is loopback"};
  char name[256] = {};
  const std::string hostname = ::gethostname(name, sizeof(name) - 1) == 0 ? name : "";
  std::string seen = "does not resolve";
  if (!hostname.empty()) {
    std::vector<std::string> addresses = resolve_host(hostname);
    if (!addresses.empty()) seen = "resolves to " + addresses.front();
    if (!addresses.empty() && !is_loopback_host(addresses.front()) && is_local_address(addresses.front()))
      return {.iface = "", .hostname = hostname, .why = "this host's name, which " + seen};
    if (!addresses.empty() && !is_loopback_host(addresses.front())) seen += ", not an address of this host";
  }
  const std::string toward = local_address_toward(master_addr);
  if (!toward.empty())
    return {.iface = "", .hostname = toward,
            .why = "the address this host reaches MASTER_ADDR=" + master_addr + " from (its host name '" + hostname +
                   "' " + seen + ")"};
  return {.iface = "", .hostname = hostname, .why = "this host's name (no route to MASTER_ADDR=" + master_addr + ")"};
}

}  // namespace loom::distributed
