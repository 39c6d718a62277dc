// GlooStore: lets Gloo's rendezvous use loom's TCPStore.
//
// Gloo connects its ranks by having each one publish its listening address under its
// rank in a gloo::rendezvous::Store and read everyone else's. Debian's Gloo ships no
// TCP store, so this adapter implements Gloo's interface over TCPStore (served by rank
// 0). The communicator wraps it in gloo::rendezvous::PrefixStore so that several
// communicators (several process groups) can rendezvous through one TCPStore.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <string>
#include <vector>

#include "parallel/store/tcp_store.h"

namespace loom::distributed {

class GlooStore : public gloo::rendezvous::Store {
 public:
  GlooStore(TCPStore& store, std::chrono::milliseconds timeout) : store_(store), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(key, std::string(data.begin(), data.end()));
  }

  std::vector<char> get(const std::string& key) override {
    store_.wait({key}, timeout_);
    std::string value = store_.get(key);
    return std::vector<char>(value.begin(), value.end());
  }

  void wait(const std::vector<std::string>& keys) override { store_.wait(keys, timeout_); }

  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    store_.wait(keys, timeout);
  }

 private:
  TCPStore& store_;
  std::chrono::milliseconds timeout_;
};

}  // namespace loom::distributed
