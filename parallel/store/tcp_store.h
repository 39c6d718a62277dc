// TCPStore: the key-value store every rank uses to meet the others (rendezvous).
//
//   // rank 0 (is_server) serves it; every rank, rank 0 included, is a client.
//   TCPStore store("127.0.0.1", 29500, /*is_server=*/rank == 0, std::chrono::seconds(30));
//   store.set("addr/" + std::to_string(rank), my_address);
//   std::string peer = store.get("addr/1");          // blocks until rank 1 has set it
//   int64_t arrived = store.add("arrived", 1);       // atomic counter
//   store.wait({"ready"});                           // blocks until the key exists
//
// Same names and meaning as torch.distributed.TCPStore. Values are bytes (a
// std::string may hold any byte). Every blocking call ends by `timeout` with a
// loom::Error naming the keys still missing.
//
// Thread safety: calls are safe from several threads but share one connection, so one
// thread's blocking get/wait delays the others' calls. Give each thread its own
// TCPStore client when several of them wait at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "parallel/store/socket.h"

namespace loom::distributed {

class StoreServer;

constexpr std::chrono::milliseconds kDefaultStoreTimeout = std::chrono::seconds(300);

class TCPStore {
 public:
  // is_server: also start the server on `port` in this process (rank 0). Port 0 with
  // is_server picks a free port; port() tells which. Clients retry connecting until
  // `timeout`, since rank 0 may start after them.
  TCPStore(std::string host, int port, bool is_server = false,
           std::chrono::milliseconds timeout = kDefaultStoreTimeout);
  ~TCPStore();
  TCPStore(const TCPStore&) = delete;
  TCPStore& operator=(const TCPStore&) = delete;

  void set(const std::string& key, const std::string& value);
  // Waits (up to timeout()) until the key exists, then returns its value.
  std::string get(const std::string& key);
  // Adds delta to the integer at key (absent counts as 0) and returns the new value.
  int64_t add(const std::string& key, int64_t delta);
  // Waits until every key exists; a loom::Error naming the missing keys on timeout.
  void wait(const std::vector<std::string>& keys);
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  // True when every key exists now (does not wait).
  bool check(const std::vector<std::string>& keys);
  // True when the key existed.
  bool delete_key(const std::string& key);
  int64_t num_keys();

  const std::string& host() const { return host_; }
  int port() const { return port_; }
  bool is_server() const { return server_ != nullptr; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }

 private:
  // Sends one request and returns the reply's payload (status byte first).
  std::string roundtrip(const std::string& frame, std::chrono::milliseconds reply_within, const std::string& what);
  std::string exchange_locked(const std::string& frame, std::chrono::milliseconds reply_within,
                              const std::string& what);
  void connect_locked();
  std::string peer() const;

  std::string host_;
  int port_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<StoreServer> server_;
  std::mutex mutex_;  // one request in flight per connection
  net::Socket socket_;
};

}  // namespace loom::distributed
