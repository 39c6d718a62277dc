#include "parallel/comm/gloo_address.h"

#include <unistd.h>

#include "parallel/store/socket.h"  // defines: net::resolve_host, net::local_address_toward, ...

namespace loom::distributed {

using net::is_loopback_host;

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
    std::vector<std::string> addresses = net::resolve_host(hostname);
    if (!addresses.empty()) seen = "resolves to " + addresses.front();
    if (!addresses.empty() && !is_loopback_host(addresses.front()) && net::is_local_address(addresses.front()))
      return {.iface = "", .hostname = hostname, .why = "this host's name, which " + seen};
    if (!addresses.empty() && !is_loopback_host(addresses.front())) seen += ", not an address of this host";
  }
  const std::string toward = net::local_address_toward(master_addr);
  if (!toward.empty())
    return {.iface = "", .hostname = toward,
            .why = "the address this host reaches MASTER_ADDR=" + master_addr + " from (its host name '" + hostname +
                   "' " + seen + ")"};
  return {.iface = "", .hostname = hostname, .why = "this host's name (no route to MASTER_ADDR=" + master_addr + ")"};
}

}  // namespace loom::distributed
