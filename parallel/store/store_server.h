// StoreServer: the key-value server that rank 0 runs for the whole job.
//
// One background thread serves every client over TCP (see protocol.h for the wire
// format). It is deliberately single-threaded: requests are tiny and rare (rendezvous,
// counters, shape checks), so one poll() loop is simple and never contends on a lock.
// Blocking waits are parked on the server, not polled by clients; see Note [Waiting on
// the server] in store_server.cpp.
//
// The constructor binds the port before returning, so "port already in use" is an
// error thrown to the caller, not a message lost in a thread. The destructor wakes the
// thread, which closes every connection and exits; clients then see the connection
// close and report that rank 0's store went away.
#pragma once

#include <memory>

namespace loom::distributed {

class StoreServer {
 public:
  // port 0: the kernel picks a free port; read it back with port().
  explicit StoreServer(int port);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const;

 private:
  struct Loop;  // the server thread's state, private to store_server.cpp
  std::unique_ptr<Loop> loop_;
};

}  // namespace loom::distributed
