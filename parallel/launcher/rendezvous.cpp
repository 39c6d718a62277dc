#include "parallel/launcher/rendezvous.h"

#include <chrono>
#include <cstdio>

#include "core/error.h"
#include "parallel/comm/launch_env.h"  // defines: kRestartCountKey
#include "parallel/store/socket.h"     // defines: net::is_local_address, net::local_address_toward, ...
#include "parallel/store/tcp_store.h"

namespace loom::launcher {

using distributed::TCPStore;
using std::chrono::milliseconds;

namespace {

constexpr int kDefaultMeetingPort = 29400;  // torchrun's, for c10d
// How long a fresh static node asks the workers' store for the job's attempt.
constexpr milliseconds kProbeTimeout = std::chrono::seconds(2);

milliseconds seconds(double s) { return milliseconds(static_cast<int64_t>(s * 1000)); }

bool names_this_host(const std::string& host) {
  for (const std::string& address : distributed::net::resolve_host(host))
    if (distributed::net::is_local_address(address)) return true;
  return false;
}

}  // namespace

Rendezvous::Rendezvous(const LaunchOptions& options) : o_(options) {
  if (o_.rdzv_backend != "c10d") return;
  const std::string& endpoint = o_.rdzv_endpoint;
  const auto colon = endpoint.rfind(':');
  const bool has_port = colon != std::string::npos && endpoint.find(':') == colon;  // not a bare IPv6 address
  host_ = has_port ? endpoint.substr(0, colon) : endpoint;
  port_ = kDefaultMeetingPort;
  if (has_port) {
    const std::string port = endpoint.substr(colon + 1);
    LOOM_CHECK(!port.empty() && port.find_first_not_of("0123456789") == std::string::npos && port.size() <= 5 &&
                   std::stoi(port) >= 1 && std::stoi(port) <= 65535,
               "loomrun: --rdzv_endpoint '", endpoint, "': expected HOST[:PORT] with a port in [1, 65535]");
    port_ = std::stoi(port);
  }
  const milliseconds join_timeout = seconds(o_.rdzv_join_timeout_s);
  if (names_this_host(host_)) {
    try {
      meeting_ = std::make_unique<TCPStore>(host_, port_, /*is_server=*/true, join_timeout);
      return;
    } catch (const Error&) {
      // Taken: another loomrun on this host (several nodes on one machine) serves it.
    }
  }
  try {
    meeting_ = std::make_unique<TCPStore>(host_, port_, /*is_server=*/false, join_timeout);
  } catch (const Error& e) {
    LOOM_FAIL("loomrun: --rdzv_backend c10d: cannot reach the meeting point ", distributed::net::endpoint(host_, port_),
              " within --rdzv_conf join_timeout=", o_.rdzv_join_timeout_s, " s. The loomrun on ", host_,
              " serves it: start it there too, with the same --rdzv_endpoint. [", e.what(), "]");
  }
}

Rendezvous::~Rendezvous() = default;

// See Note [A node that comes back].
int Rendezvous::first_attempt() {
  if (meeting_) {
    const std::string key = "rdzv/" + o_.rdzv_id + "/attempt";
    return meeting_->check({key}) ? std::stoi(meeting_->get(key)) : 0;
  }
  // Node 0 serves the store: nobody to ask. Without restarts every attempt is the first.
  if (o_.nnodes == 1 || o_.node_rank == 0 || o_.max_restarts == 0) return 0;
  try {
    TCPStore store(o_.master_addr, o_.master_port, /*is_server=*/false, kProbeTimeout);
    return std::stoi(store.get(distributed::kRestartCountKey));
  } catch (const std::exception&) {
    return 0;  // no store yet (the job is starting) or no answer: a first attempt
  }
}

Placement Rendezvous::join(int attempt) {
  if (!meeting_) return {o_.node_rank, o_.master_addr, o_.master_port};
  const std::string round = "rdzv/" + o_.rdzv_id + "/" + std::to_string(attempt) + "/";
  const int node = static_cast<int>(meeting_->add(round + "joined", 1)) - 1;
  LOOM_CHECK(node < o_.nnodes, "loomrun: ", node + 1, " nodes joined attempt ", attempt, " of --rdzv_id ", o_.rdzv_id,
             " at ", distributed::net::endpoint(host_, port_), ", but --nnodes is ", o_.nnodes, ". Is another job "
             "using the same --rdzv_id, or a node started twice?");
  if (node == 0) {
    // The workers' store: on this node, at the address the others reach the meeting point from.
    std::string address = distributed::net::local_address_toward(host_);
    if (address.empty()) address = host_;
    const int port = distributed::net::find_free_port();
    meeting_->set(round + "master", address + " " + std::to_string(port));
    meeting_->set("rdzv/" + o_.rdzv_id + "/attempt", std::to_string(attempt));
  }
  const std::string master = meeting_->get(round + "master");  // waits for node 0, up to the join timeout
  const auto space = master.find(' ');
  return {node, master.substr(0, space), std::stoi(master.substr(space + 1))};
}

}  // namespace loom::launcher
