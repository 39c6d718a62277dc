#include "parallel/comm/shm_collectives.h"

#include <linux/futex.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <immintrin.h>  // defines: _mm_pause
#endif

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <climits>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "parallel/comm/host_reduce.h"  // defines: reduce

namespace loom::distributed {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

constexpr uint64_t kMagic = 0x316d68736d6f6f6cull;  // "loomshm1"
constexpr int kSpins = 500;                        // ~10 microseconds of _mm_pause
constexpr milliseconds kSleepSlice{100};           // see Note [Waiting without burning a core]
constexpr size_t kSymmetricChunkBytes = 64 << 10;  // Note [Whoever waits reduces]

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

uint64_t pid_namespace() {
  struct stat st {};
  return ::stat("/proc/self/ns/pid", &st) == 0 ? uint64_t(st.st_ino) : 0;
}

// Counters wrap around; "reached" compares them as a window, not as plain integers.
bool reached(uint32_t counter, uint32_t target) { return static_cast<int32_t>(counter - target) >= 0; }

uint32_t* futex_word(std::atomic<uint32_t>& a) { return reinterpret_cast<uint32_t*>(&a); }

void futex_wake_all(std::atomic<uint32_t>& word) {
  ::syscall(SYS_futex, futex_word(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Sleeps while `word` still holds `seen`, at most `for_at_most`; spurious wake-ups are fine.
void futex_wait(std::atomic<uint32_t>& word, uint32_t seen, milliseconds for_at_most) {
  struct timespec ts {};
  ts.tv_sec = static_cast<time_t>(for_at_most.count() / 1000);
  ts.tv_nsec = static_cast<long>((for_at_most.count() % 1000) * 1000000);
  ::syscall(SYS_futex, futex_word(word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

// [lo, hi) of the share of `count` elements that rank p reduces: contiguous, in rank
// order, multiples of 16 elements (whole cache lines for 4-byte types) except the last.
std::pair<size_t, size_t> share(size_t count, int p, int size) {
  const size_t per = round_up((count + size_t(size) - 1) / size_t(size), 16);
  return {std::min(count, per * size_t(p)), std::min(count, per * size_t(p + 1))};
}

}  // namespace

struct alignas(64) ShmCollectives::Header {
  uint64_t magic;
  int64_t size;
  int64_t staging_bytes;
  std::atomic<int32_t> failed;  // 0, or 1 + the first rank that gave up
  // Note [Whoever waits reduces]: symmetric all_reduce's chunks claimed and finished,
  // over the communicator's life. chunks_done is a futex word, so 32 bits (it wraps).
  alignas(64) std::atomic<uint64_t> chunks_claimed;
  alignas(64) std::atomic<uint32_t> chunks_done;
};

struct ShmCollectives::RankControl {
  alignas(64) std::atomic<uint32_t> phase;  // the futex word: alone on its cache line
  alignas(64) int64_t pid;
  uint64_t pid_namespace;
  Fingerprint fingerprints[2];  // by round parity; see Note [Two of everything]
  int64_t symmetric_id[2];      // and where the tensor is: Note [Symmetric memory]
  int64_t symmetric_offset[2];
  int64_t arrived_ns[2];        // Note [Whoever waits reduces]
};

// ---- setup ----------------------------------------------------------------------------

static constexpr size_t control_offset() { return 256; }

// Rank 0 creates a segment of `bytes` unless `refusal` already says why not, and
// publishes its name (or the reason) under `key`; every other rank maps it; all check in;
// rank 0 unlinks the name (Note [Unlink as soon as everyone has mapped]). Every rank
// returns the same outcome: the segment, or an unmapped one and the same *why_not.
// `on_mapped` runs on each rank once it has mapped the segment, before it checks in, so
// what it writes is there when any rank returns.
SharedMemorySegment ShmCollectives::share_segment(TCPStore& store, const std::string& key, int rank, int size,
                                                  size_t bytes, const std::string& name_tag,
                                                  std::chrono::milliseconds timeout, std::string refusal,
                                                  const std::function<void(void*)>& on_mapped, std::string* why_not) {
  SharedMemorySegment segment;
  if (rank == 0) {
    std::string decision = refusal.empty() ? "" : "none:" + refusal;
    if (decision.empty()) {
      try {
        segment = SharedMemorySegment::create(unique_segment_name(name_tag), bytes);
        on_mapped(segment.data());
        decision = "shm:" + segment.name();
      } catch (const std::exception& e) {
        decision = detail::str("none:rank 0 could not create the shared-memory segment: ", e.what());
      }
    }
    store.set(key + "/decision", decision);
  }
  const std::string decision = store.get(key + "/decision");
  if (decision.rfind("none:", 0) == 0) {
    *why_not = decision.substr(5);
    return {};
  }
  std::string mapped = "ok";
  if (rank != 0) {
    try {
      segment = SharedMemorySegment::open(decision.substr(4), bytes);
      on_mapped(segment.data());
    } catch (const std::exception& e) {
      mapped = detail::str("rank ", rank, " could not map it: ", e.what());
    }
  }
  store.set(detail::str(key, "/mapped/", rank), mapped);
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(detail::str(key, "/mapped/", r));
  std::string failure;
  try {
    store.wait(keys, timeout);
    for (const auto& k : keys)
      if (std::string v = store.get(k); v != "ok" && failure.empty()) failure = v;
  } catch (...) {
    segment.unlink();  // rank 0: see Note [Unlink as soon as everyone has mapped]
    throw;
  }
  segment.unlink();
  if (!failure.empty()) {
    *why_not = failure;
    return {};
  }
  return segment;
}

std::unique_ptr<ShmCollectives> ShmCollectives::connect(TCPStore& store, const std::string& prefix, int rank,
                                                        int size, bool wanted, ShmOptions options,
                                                        std::string* why_not) {
  const std::string base = prefix + "/shm";
  const std::string identity = host_identity();
  store.set(detail::str(base, "/host/", rank), (wanted ? "1" : "0") + identity);

  const size_t half = whole_pages(options.staging_bytes);
  const size_t controls = whole_pages(control_offset() + size_t(size) * sizeof(RankControl));
  const size_t total = controls + size_t(size) * 2 * half;

  // Rank 0 decides for everyone, so that every rank takes the same path.
  std::string refusal;
  if (rank == 0) {
    for (int r = 0; r < size && refusal.empty(); ++r) {
      std::string entry = store.get(detail::str(base, "/host/", r));
      if (entry[0] != '1') refusal = detail::str("rank ", r, " has shared memory turned off");
      else if (entry.substr(1) != identity)
        refusal = detail::str("rank ", r, " runs on another host (", entry.substr(1), " vs ", identity, ")");
    }
  }
  auto on_mapped = [&](void* data) {
    if (rank == 0) new (data) Header{kMagic, size, static_cast<int64_t>(half), {0}, {0}, {0}};
    auto* control = reinterpret_cast<RankControl*>(static_cast<uint8_t*>(data) + control_offset()) + rank;
    control->pid = ::getpid();
    control->pid_namespace = pid_namespace();
  };
  std::string why;
  SharedMemorySegment segment =
      share_segment(store, base, rank, size, total, prefix, options.timeout, refusal, on_mapped, &why);
  if (!segment.mapped()) {
    if (why_not) *why_not = why;
    return nullptr;
  }
  return std::unique_ptr<ShmCollectives>(new ShmCollectives(std::move(segment), rank, size, options));
}

ShmCollectives::ShmCollectives(SharedMemorySegment segment, int rank, int size, ShmOptions options)
    : segment_(std::move(segment)), rank_(rank), size_(size), options_(options) {
  static_assert(sizeof(Header) <= control_offset(), "the header must fit before the control blocks");
  LOOM_CHECK(header().magic == kMagic && header().size == size, "shared-memory segment ", segment_.name(),
             " has an unexpected header (ranks built with different loom versions?)");
  half_bytes_ = static_cast<size_t>(header().staging_bytes);
  LOOM_CHECK(half_bytes_ >= size_t(size) * 16, "shared-memory staging of ", half_bytes_, " bytes is too small for ",
             size, " ranks (reduce_scatter puts one slot per rank in it); raise GlooOptions::shm_staging_bytes");
  staging_offset_ = whole_pages(control_offset() + size_t(size) * sizeof(RankControl));
}

ShmCollectives::Header& ShmCollectives::header() const { return *static_cast<Header*>(segment_.data()); }

ShmCollectives::RankControl& ShmCollectives::control(int rank) const {
  return reinterpret_cast<RankControl*>(static_cast<uint8_t*>(segment_.data()) + control_offset())[rank];
}

uint8_t* ShmCollectives::staging(int rank, uint64_t round) const {
  return static_cast<uint8_t*>(segment_.data()) + staging_offset_ + (size_t(rank) * 2 + round % 2) * half_bytes_;
}

// ---- synchronisation ------------------------------------------------------------------

void ShmCollectives::fail(const Op& op, const std::string& why) {
  int32_t none = 0;
  header().failed.compare_exchange_strong(none, rank_ + 1);  // let waiting peers fail fast
  broken_ = detail::str(op.describe(), " failed: ", why, " [shared-memory transport]");
  LOOM_FAIL(broken_, ". This communicator cannot be used any more");
}

void ShmCollectives::phase(const Op& op, Deadline deadline, const std::string& step) {
  ++phase_;
  control(rank_).phase.store(phase_, std::memory_order_release);
  futex_wake_all(control(rank_).phase);
  for (int p = 0; p < size_; ++p)
    if (p != rank_) wait_until(control(p).phase, phase_, p, op, deadline, step);
}

void ShmCollectives::wait_until(std::atomic<uint32_t>& word, uint32_t target, int peer, const Op& op,
                                Deadline deadline, const std::string& step, const std::function<bool()>& unless) {
  for (int i = 0; i < kSpins; ++i) {
    if (reached(word.load(std::memory_order_acquire), target)) return;
    cpu_relax();
  }
  const std::string who = peer >= 0 ? detail::str("rank ", peer) : std::string("the other ranks");
  const uint64_t my_pid_namespace = pid_namespace();
  while (true) {
    const uint32_t seen = word.load(std::memory_order_acquire);
    if (reached(seen, target) || (unless && unless())) return;
    if (int32_t failed = header().failed.load(std::memory_order_relaxed); failed != 0)
      fail(op, detail::str("rank ", failed - 1, " gave up on a collective (its own output says why) while rank ",
                           rank_, " waited for ", who, " to ", step));
    for (int p = 0; p < size_; ++p) {
      const RankControl& c = control(p);
      if (p == rank_ || (peer >= 0 && p != peer) || c.pid_namespace != my_pid_namespace) continue;
      if (::kill(static_cast<pid_t>(c.pid), 0) != 0 && errno == ESRCH)
        fail(op, detail::str("rank ", p, " (pid ", c.pid, ") exited while rank ", rank_, " waited for ", who,
                             " to ", step, ". Check that rank's output for why it stopped"));
    }
    const auto now = Clock::now();
    if (now >= deadline)
      fail(op, detail::str("timed out after ", options_.timeout.count(), " ms waiting for ", who, " to ", step,
                           ". That rank did not reach this operation in time: it may be stuck, slower than the "
                           "timeout, or calling collectives in a different order. Check the other ranks' output"));
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - now) + milliseconds(1);
    futex_wait(word, seen, std::min(left, kSleepSlice));
  }
}

void ShmCollectives::publish_fingerprint(const Op& op, uint64_t round, int64_t symmetric_id,
                                         int64_t symmetric_offset) {
  RankControl& mine = control(rank_);
  mine.fingerprints[round % 2] = fingerprint(op);
  mine.symmetric_id[round % 2] = symmetric_id;
  mine.symmetric_offset[round % 2] = symmetric_offset;
}

void ShmCollectives::check_fingerprints(const Op& op, uint64_t round) const {
  std::vector<Fingerprint> all;
  for (int r = 0; r < size_; ++r) all.push_back(control(r).fingerprints[round % 2]);
  check_same_collective(all, op);  // every rank sees the same ones: the same decision everywhere
  const size_t slot = round % 2;
  auto same_place = [&](int r) {
    return control(r).symmetric_id[slot] == control(0).symmetric_id[slot] &&
           control(r).symmetric_offset[slot] == control(0).symmetric_offset[slot];
  };
  bool agree = true;
  for (int r = 1; r < size_ && agree; ++r) agree = same_place(r);
  if (agree) return;
  std::string places;
  for (int r = 0; r < size_; ++r) {
    const RankControl& c = control(r);
    places += c.symmetric_id[slot] < 0 ? detail::str("\n  rank ", r, ": ordinary memory")
                                       : detail::str("\n  rank ", r, ": symmetric allocation #", c.symmetric_id[slot],
                                                     " at byte ", c.symmetric_offset[slot]);
  }
  LOOM_FAIL(op.describe(), ": the ranks' tensors are not at the same place in symmetric memory:", places,
            "\nSee Note [Symmetric memory]: every rank calls zeros_symmetric together and passes the same slice "
            "of it to the collective (or every rank passes ordinary tensors). Nothing was moved");
}

// ---- the collectives --------------------------------------------------------------------

void ShmCollectives::run(const Op& op, Deadline deadline, Work* caller) {
  LOOM_CHECK(broken_.empty(), op.describe(), " was not run: this communicator failed earlier and cannot be used any "
             "more. Destroy it and create a new group on every rank. The first failure was: ", broken_);
  switch (op.kind) {
    case OpKind::AllReduce: return all_reduce(op, deadline, caller);
    case OpKind::Broadcast: return broadcast(op, deadline);
    case OpKind::AllGather: return all_gather(op, deadline);
    case OpKind::ReduceScatter: return reduce_scatter(op, deadline);
    case OpKind::Barrier: return barrier(op, deadline);
    default: LOOM_FAIL(op.describe(), ": not a collective");
  }
}

// Every collective below is a loop of rounds that runs at least once, so that round 0
// carries the fingerprints even for empty tensors. Messages count chunks from 1.
static std::string chunk_text(const char* what, size_t chunk, size_t chunks) {
  return detail::str(what, " (chunk ", chunk + 1, " of ", chunks, ")");
}

void ShmCollectives::all_reduce(const Op& op, Deadline deadline, Work* caller) {
  const Tensor& t = op.tensor;
  if (SymmetricPlace place = find_symmetric(t); place.id >= 0)
    return all_reduce_symmetric(op, deadline, place, caller);
  const size_t elem = element_size(t.dtype()), n = static_cast<size_t>(t.numel());
  const size_t per_round = half_bytes_ / elem;
  const size_t chunks = std::max<size_t>(1, (n + per_round - 1) / per_round);
  auto* data = static_cast<uint8_t*>(t.raw_data());
  std::vector<const uint8_t*> sources(size_);
  for (size_t c = 0, done = 0; c < chunks; ++c) {
    const uint64_t round = round_++;
    const size_t count = std::min(per_round, n - done);
    uint8_t* mine = staging(rank_, round);
    if (count) std::memcpy(mine, data + done * elem, count * elem);
    if (c == 0) publish_fingerprint(op, round);
    phase(op, deadline, chunk_text("copy its data in", c, chunks));
    if (c == 0) check_fingerprints(op, round);
    // My share, reduced in place in my staging half, where the peers will read it.
    const auto [lo, hi] = share(count, rank_, size_);
    for (int s = 0; s < size_; ++s) sources[s] = staging(s, round) + lo * elem;
    uint8_t* const share_of_mine[1] = {mine + lo * elem};
    reduce(t.dtype(), share_of_mine, sources, hi - lo, op.reduce, size_);
    phase(op, deadline, chunk_text("reduce its share", c, chunks));
    for (int p = 0; p < size_; ++p) {
      const auto [plo, phi] = share(count, p, size_);
      std::memcpy(data + (done + plo) * elem, staging(p, round) + plo * elem, (phi - plo) * elem);
    }
    done += count;
  }
}

// Note [Symmetric memory] (communicator.h): every rank's tensor is already in the
// segment, at place.block(rank), so there is no staging: after one phase (everyone has
// arrived, so every block holds its rank's data) the tensor is reduced chunk by chunk,
// each chunk read from every block and its result written into every block, by the
// ranks that would otherwise wait (Note [Whoever waits reduces]). A rank returns once
// every chunk is done: by then nobody reads any block any more, so the caller may
// overwrite its tensor at once (DDP's next backward writes its buckets).
void ShmCollectives::all_reduce_symmetric(const Op& op, Deadline deadline, const SymmetricPlace& place,
                                          Work* caller) {
  const Tensor& t = op.tensor;
  const size_t elem = element_size(t.dtype()), count = static_cast<size_t>(t.numel());
  const uint64_t round = round_++;
  publish_fingerprint(op, round, place.id, place.offset);
  control(rank_).arrived_ns[round % 2] = Clock::now().time_since_epoch().count();
  phase(op, deadline, "arrive (symmetric memory)");
  check_fingerprints(op, round);
  const size_t per_chunk = kSymmetricChunkBytes / elem;
  const uint64_t first = chunk_base_, end = first + (count + per_chunk - 1) / per_chunk;
  chunk_base_ = end;  // the same on every rank from here on, whatever happens below
  std::vector<uint8_t*> blocks(size_);
  std::vector<const uint8_t*> sources(size_);
  auto reduce_chunks = [&] {
    for (uint64_t chunk; claim_chunk(end, &chunk);) {
      const size_t lo = static_cast<size_t>(chunk - first) * per_chunk;
      for (int s = 0; s < size_; ++s) sources[s] = blocks[s] = place.block(s) + lo * elem;
      reduce(t.dtype(), blocks, sources, std::min(per_chunk, count - lo), op.reduce, size_);
      chunks_reduced_.fetch_add(1, std::memory_order_relaxed);
      if (header().chunks_done.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(end))
        futex_wake_all(header().chunks_done);
    }
  };
  const std::string step = "finish the chunks it reduces (symmetric memory)";
  if (last_to_arrive(round) == rank_ && size_ > 1 && caller) {
    // Busy elsewhere, most likely: leave the chunks to the others until the caller waits.
    caller->on_awaited([this] { futex_wake_all(header().chunks_done); });
    wait_until(header().chunks_done, static_cast<uint32_t>(end), -1, op, deadline, step,
               [caller] { return caller->awaited(); });
    caller->on_awaited(nullptr);
  }
  reduce_chunks();
  wait_until(header().chunks_done, static_cast<uint32_t>(end), -1, op, deadline, step);
}

// The rank that arrived last at `round`: the latest arrival time (CLOCK_MONOTONIC, one
// clock for every process of a host), ties to the higher rank. Every rank reads the same
// stamps after the arrival phase, so every rank names the same one.
int ShmCollectives::last_to_arrive(uint64_t round) const {
  int last = 0;
  for (int r = 1; r < size_; ++r)
    if (control(r).arrived_ns[round % 2] >= control(last).arrived_ns[round % 2]) last = r;
  return last;
}

// Note [Whoever waits reduces]: chunks are handed out by one counter that only grows.
// A claim never takes the counter past `end`, so when every chunk of this all_reduce is
// taken it stands exactly at the next one's first chunk; a rank still looking for work
// here then finds none, and nobody can claim the next one's chunks before every rank has
// arrived at it, that is, finished this one.
bool ShmCollectives::claim_chunk(uint64_t end, uint64_t* chunk) {
  std::atomic<uint64_t>& next = header().chunks_claimed;
  uint64_t seen = next.load(std::memory_order_relaxed);
  while (seen < end)
    if (next.compare_exchange_weak(seen, seen + 1, std::memory_order_relaxed)) {
      *chunk = seen;
      return true;
    }
  return false;
}

void ShmCollectives::broadcast(const Op& op, Deadline deadline) {
  const Tensor& t = op.tensor;
  const size_t n = t.nbytes();
  const size_t chunks = std::max<size_t>(1, (n + half_bytes_ - 1) / half_bytes_);
  auto* data = static_cast<uint8_t*>(t.raw_data());
  const int root = op.peer;
  for (size_t c = 0, done = 0; c < chunks; ++c) {
    const uint64_t round = round_++;
    const size_t count = std::min(half_bytes_, n - done);
    if (rank_ == root && count) std::memcpy(staging(rank_, round), data + done, count);
    if (c == 0) publish_fingerprint(op, round);
    phase(op, deadline, chunk_text(rank_ == root ? "arrive" : "copy the root's data in", c, chunks));
    if (c == 0) check_fingerprints(op, round);
    if (rank_ != root && count) std::memcpy(data + done, staging(root, round), count);
    done += count;
  }
}

void ShmCollectives::all_gather(const Op& op, Deadline deadline) {
  const Tensor& in = op.tensor;
  if (SymmetricPlace place = find_symmetric(in); place.id >= 0) return all_gather_symmetric(op, deadline, place);
  const size_t n = in.nbytes();
  const size_t chunks = std::max<size_t>(1, (n + half_bytes_ - 1) / half_bytes_);
  const auto* data = static_cast<const uint8_t*>(in.raw_data());
  for (size_t c = 0, done = 0; c < chunks; ++c) {
    const uint64_t round = round_++;
    const size_t count = std::min(half_bytes_, n - done);
    if (count) std::memcpy(staging(rank_, round), data + done, count);
    if (c == 0) publish_fingerprint(op, round);
    phase(op, deadline, chunk_text("copy its data in", c, chunks));
    if (c == 0) check_fingerprints(op, round);
    for (int p = 0; p < size_ && count; ++p)
      std::memcpy(static_cast<uint8_t*>(op.list[p].raw_data()) + done, staging(p, round), count);
    done += count;
  }
}

// Note [Symmetric all_gather]
// When the input lies in symmetric memory (Note [Symmetric memory], communicator.h),
// every rank's piece is already where every rank can read it. After one phase (every
// rank has arrived, so every piece holds its final values) each rank copies all the
// pieces straight into its outputs; a second phase keeps every rank from returning
// while a peer may still read its piece, since its caller may then rewrite it (FSDP's
// optimizer steps its shard in place). The gathered bytes are copied once instead of
// twice (into staging, out of it), with no chunking: FSDP gathers every unit twice a
// step, so this is a third of its all-gather memory traffic (Note [Shards in symmetric
// memory], parallel/fsdp/flat_param.cpp).
void ShmCollectives::all_gather_symmetric(const Op& op, Deadline deadline, const SymmetricPlace& place) {
  const size_t n = op.tensor.nbytes();
  const uint64_t round = round_++;
  publish_fingerprint(op, round, place.id, place.offset);
  phase(op, deadline, "arrive (symmetric memory)");
  check_fingerprints(op, round);
  for (int p = 0; p < size_ && n; ++p) std::memcpy(op.list[p].raw_data(), place.block(p), n);
  phase(op, deadline, "finish reading every rank's piece (symmetric memory)");
}

void ShmCollectives::all_gather_one_sided(std::vector<Tensor>& out, const Tensor& in) {
  const SymmetricPlace place = find_symmetric(in);
  LOOM_CHECK(place.id >= 0, "all_gather_one_sided: the input is not in symmetric memory");
  for (int p = 0; p < size_ && in.nbytes(); ++p) std::memcpy(out[size_t(p)].raw_data(), place.block(p), in.nbytes());
}

// Round: every rank copies, for each destination p, its chunk of in[p] into slot p of
// its staging half; then rank r reduces slot r of every rank's half into its output.
// Each rank reduces only its own 1/world of the data. Its own slot is read by nobody
// else, so it is not copied: the reduction reads it from in[r] where it is (at two
// ranks that halves the copying; FSDP reduce-scatters every gradient each step).
void ShmCollectives::reduce_scatter(const Op& op, Deadline deadline) {
  const Tensor& out = op.tensor;
  const size_t elem = element_size(out.dtype()), n = static_cast<size_t>(out.numel());
  const size_t per_round = std::max<size_t>(1, half_bytes_ / elem / size_t(size_));
  const size_t chunks = std::max<size_t>(1, (n + per_round - 1) / per_round);
  auto* result = static_cast<uint8_t*>(out.raw_data());
  std::vector<const uint8_t*> sources(size_);
  for (size_t c = 0, done = 0; c < chunks; ++c) {
    const uint64_t round = round_++;
    const size_t count = std::min(per_round, n - done);
    uint8_t* mine = staging(rank_, round);
    for (int p = 0; p < size_ && count; ++p)
      if (p != rank_)
        std::memcpy(mine + p * per_round * elem, static_cast<const uint8_t*>(op.list[p].raw_data()) + done * elem,
                    count * elem);
    if (c == 0) publish_fingerprint(op, round);
    phase(op, deadline, chunk_text("copy its data in", c, chunks));
    if (c == 0) check_fingerprints(op, round);
    for (int s = 0; s < size_; ++s) sources[s] = staging(s, round) + rank_ * per_round * elem;
    sources[rank_] = static_cast<const uint8_t*>(op.list[rank_].raw_data()) + done * elem;
    uint8_t* const into[1] = {result + done * elem};
    reduce(out.dtype(), into, sources, count, op.reduce, size_);
    done += count;
  }
}

void ShmCollectives::barrier(const Op& op, Deadline deadline) {
  const uint64_t round = round_++;
  publish_fingerprint(op, round);
  phase(op, deadline, "arrive");
  check_fingerprints(op, round);
}

}  // namespace loom::distributed
