// Fingerprints through the store; see Note [Fingerprints through the store].
#include "parallel/comm/store_fingerprints.h"

#include <cstring>

#include "core/error.h"

namespace loom::distributed {

using std::chrono::milliseconds;

static std::string encode(const Fingerprint& f) {
  std::string bytes(sizeof(f.words), '\0');
  std::memcpy(bytes.data(), f.words.data(), sizeof(f.words));
  return bytes;
}

static Fingerprint decode(const std::string& bytes, const std::string& key) {
  Fingerprint f;
  LOOM_CHECK(bytes.size() == sizeof(f.words), "the store key '", key, "' holds ", bytes.size(), " bytes, not a ",
             sizeof(f.words), "-byte fingerprint: another program (or another loom version) uses the same prefix");
  std::memcpy(f.words.data(), bytes.data(), sizeof(f.words));
  return f;
}

static milliseconds until(StoreFingerprints::Deadline deadline) {
  auto left = std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
  return std::max(left, milliseconds(1));
}

StoreFingerprints::StoreFingerprints(std::shared_ptr<TCPStore> store, std::string prefix, int rank, int size)
    : store_(std::move(store)), prefix_(std::move(prefix)), rank_(rank), sent_(size), received_(size) {
  LOOM_CHECK(store_ != nullptr, "StoreFingerprints: the store is null");
}

std::string StoreFingerprints::collective_key(uint64_t seq, int rank) const {
  return detail::str(prefix_, "/fp/", seq, "/", rank);
}

std::string StoreFingerprints::message_key(int src, int dst, uint64_t number) const {
  return detail::str(prefix_, "/p2p/", src, "-", dst, "/", number);
}

StoreFingerprints::Gathered StoreFingerprints::gather(const Op& op, Deadline deadline) {
  const int size = static_cast<int>(sent_.size());
  store_->set(collective_key(op.seq, rank_), encode(fingerprint(op)));
  std::vector<std::string> others;
  for (int r = 0; r < size; ++r)
    if (r != rank_) others.push_back(collective_key(op.seq, r));

  Gathered out;
  try {
    if (!others.empty()) store_->wait(others, until(deadline));
  } catch (const Error&) {
    // A timeout, or a store that went away: only the first is an answer.
    for (int r = 0; r < size; ++r)
      if (r != rank_ && !store_->check({collective_key(op.seq, r)})) out.missing.push_back(r);
    if (out.missing.empty()) throw;
    return out;
  }
  out.all.resize(size);
  for (int r = 0; r < size; ++r) {
    const std::string key = collective_key(op.seq, r);
    out.all[r] = r == rank_ ? fingerprint(op) : decode(store_->get(key), key);
  }
  // See the Note: every rank is past reading the previous collective's keys.
  if (last_gathered_) store_->delete_key(collective_key(*last_gathered_, rank_));
  last_gathered_ = op.seq;
  return out;
}

void StoreFingerprints::post_header(const Op& op) {
  const uint64_t number = sent_.at(op.peer)++;
  store_->set(message_key(rank_, op.peer, number), encode(fingerprint(op, op.tag)));
}

std::optional<Fingerprint> StoreFingerprints::take_header(const Op& op, Deadline deadline) {
  const std::string key = message_key(op.peer, rank_, received_.at(op.peer));
  try {
    store_->wait({key}, until(deadline));
  } catch (const Error&) {
    if (!store_->check({key})) return std::nullopt;  // not sent in time (else: the store failed)
    throw;
  }
  Fingerprint header = decode(store_->get(key), key);
  store_->delete_key(key);
  ++received_.at(op.peer);
  return header;
}

}  // namespace loom::distributed
