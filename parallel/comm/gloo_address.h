// Which address a rank gives Gloo: the one its peers connect to.
//
//   GlooAddress at = choose_gloo_address(getenv("GLOO_SOCKET_IFNAME"), "10.0.0.1");
//   options.iface = at.iface;  options.hostname = at.hostname;   // at.why, for the debug log
//
// Note [Which address a rank gives Gloo]
// Every rank listens on one address and publishes it in the store; the others connect to
// it. On one machine that is 127.0.0.1. Across machines it must be an address the peers
// reach, and the usual defaults get it wrong in ordinary setups: Debian writes
// "127.0.1.1 <hostname>" into /etc/hosts, containers and network namespaces often map the
// host name to 127.0.0.1 or to an address of another namespace. A rank that publishes a
// loopback address makes every peer connect to itself, and the job stops at its first
// collective until the timeout. So, in order:
//   1. GLOO_SOCKET_IFNAME names the interface (PyTorch's variable; the first of a
//      comma-separated list): its address, whatever else holds.
//   2. MASTER_ADDR is a loopback address: every rank is on this machine; 127.0.0.1.
//   3. This machine's host name resolves to an address that is not loopback (and is one of
//      this machine's): the host name, as PyTorch's gloo backend does.
//   4. Otherwise: the address this machine sends from to reach MASTER_ADDR (what the
//      kernel's routing table picks; learnt by connecting a UDP socket, which sends
//      nothing). Rank 0's own host is reachable from the others by the address they use
//      for MASTER_ADDR, so it is the interface they share with it.
// Step 4 is loom's addition (net::local_address_toward, parallel/store/socket.h); it is why multi-node runs need no GLOO_SOCKET_IFNAME in
// network namespaces (scripts/two_hosts.sh) or on machines with a Debian /etc/hosts.
#pragma once

#include <string>

namespace loom::distributed {

struct GlooAddress {
  std::string iface;     // set: listen on this interface's address (rule 1)
  std::string hostname;  // else: listen on this name's or address's first address
  std::string why;       // which rule chose it, in words, for LOOM_DISTRIBUTED_DEBUG=info
};

// See Note [Which address a rank gives Gloo]. `ifname` may be null or empty.
GlooAddress choose_gloo_address(const char* ifname, const std::string& master_addr);

}  // namespace loom::distributed
