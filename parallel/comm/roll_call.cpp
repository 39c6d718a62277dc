#include "parallel/comm/roll_call.h"

#include <unistd.h>

#include <vector>

#include "core/error.h"

namespace loom::distributed {

namespace {

std::string host_key(const std::string& prefix, int rank) { return detail::str(prefix, "/host/", rank); }
std::string answer_key(const std::string& prefix, int rank) { return detail::str(prefix, "/roll_call/", rank); }

std::string first_sentence(const std::string& text) { return text.substr(0, text.find(". ")); }

std::string seconds(std::chrono::milliseconds t) { return detail::str(t.count() / 1000.0, " s"); }

// "2, 3" and, when known, " (on node02 at 10.0.0.2)" for the hosts they were on.
std::string ranks_and_hosts(TCPStore& store, const std::string& prefix, const std::vector<int>& ranks) {
  std::string list, hosts;
  std::vector<std::string> seen;
  for (size_t i = 0; i < ranks.size(); ++i) {
    list += (i ? ", " : "") + std::to_string(ranks[i]);
    std::string host;
    try {
      if (store.check({host_key(prefix, ranks[i])})) host = store.get(host_key(prefix, ranks[i]));
    } catch (const std::exception&) {
    }
    bool known = host.empty();
    for (const auto& h : seen) known = known || h == host;
    if (!known) {
      seen.push_back(host);
      hosts += (hosts.empty() ? "" : "; ") + host;
    }
  }
  return list + (hosts.empty() ? "" : " (on " + hosts + ")");
}

}  // namespace

void announce_host(TCPStore& store, const std::string& prefix, int rank, const std::string& address) {
  char name[256] = {};
  std::string host = ::gethostname(name, sizeof(name) - 1) == 0 ? name : "?";
  store.set(host_key(prefix, rank), address.empty() || address == host ? host : host + " at " + address);
}

// See Note [A roll call after a failure].
std::string roll_call(const std::string& store_host, int store_port, const std::string& prefix, int rank, int size,
                      const std::string& what, std::chrono::milliseconds wait) {
  try {
    TCPStore store(store_host, store_port, /*is_server=*/false, wait);
    store.set(answer_key(prefix, rank), what);
    std::vector<std::string> keys;
    for (int r = 0; r < size; ++r) keys.push_back(answer_key(prefix, r));
    try {
      store.wait(keys, wait);
    } catch (const std::exception&) {
    }
    std::vector<int> missing, answered;
    for (int r = 0; r < size; ++r) (store.check({keys[size_t(r)]}) ? answered : missing).push_back(r);
    if (missing.empty())
      return detail::str("Every rank of the group reached a failure too (a roll call through the store), so none "
                         "of them is gone: look for the first error, or raise the timeout if they are slow");
    return detail::str(missing.size() == 1 ? "Rank " : "Ranks ", ranks_and_hosts(store, prefix, missing),
                       " did not answer a roll call through the store within ",
                       seconds(wait), ": exited, stuck outside the group's operations, or on a host this one cannot "
                       "reach (ranks ", ranks_and_hosts(store, prefix, answered), " answered)");
  } catch (const std::exception& e) {
    return detail::str("The store at ", store_host, ":", store_port, " (served by rank 0's process) cannot be reached "
                       "either, so rank 0's process has exited or its host is unreachable from this one [",
                       first_sentence(e.what()), "]");
  }
}

}  // namespace loom::distributed
