// trace: a tiny tracer that writes Chrome trace JSON (open it in https://ui.perfetto.dev
// or chrome://tracing): named spans on tracks, the picture that shows what overlaps.
//
//   LOOM_TRACE=trace.json build/examples/train_cifar10 ...     // whole run, written at exit
//
//   loom::trace::enable();                                      // or from code
//   {
//     loom::trace::Span span("backward", "train");              // on the calling thread's track
//     loss.backward();
//   }
//   loom::trace::record("all_reduce bucket 0", "ddp", loom::trace::track("comm"), t0, t1 - t0);
//   loom::trace::write("trace.json");                           // atomically (temp file + rename)
//
// A *track* is a row in the viewer (Chrome's "tid"): every thread gets one on first use,
// and code may name extra ones ("comm (rank 1)") for work that happens elsewhere, such as
// a collective running on a communicator's worker thread. The process row (Chrome's
// "pid") is the distributed rank: RANK from the environment, else 0, so the files of
// several ranks can be merged into one picture (docs/ddp.md shows how).
//
// Note [Tracing costs nothing when off]
// Every entry point first reads one relaxed atomic bool; a Span that finds tracing off
// stores nothing and never reads the clock. So spans can stay in hot loops (a training
// step, every gradient bucket) for good. When on, an event is a few words appended to a
// vector under a mutex: a few hundred nanoseconds, for events that mark milliseconds.
//
// Note [LOOM_TRACE]
// LOOM_TRACE=path turns tracing on at program start and writes `path` at exit. With
// several ranks (RANK set and WORLD_SIZE > 1) each process writes its own file: "{rank}"
// in the path is replaced by the rank, or, without it, ".rank<R>" goes before the
// extension (trace.json -> trace.rank1.json). Timestamps are CLOCK_MONOTONIC
// microseconds, one clock for every process on a machine, so ranks' files line up.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace loom::trace {

namespace detail {
extern std::atomic<bool> g_enabled;
}  // namespace detail

// See Note [Tracing costs nothing when off].
inline bool enabled() { return detail::g_enabled.load(std::memory_order_relaxed); }

// Starts recording; keeps the output path (LOOM_TRACE's, or a previous enable(path)'s).
void enable();
// Starts recording and sets the file written at exit and by flush(); "" for none.
void enable(const std::string& path);
// Stops recording; what was recorded stays until clear() or the next write.
void disable();
// Drops every recorded event (tracks and their names stay).
void clear();

// Microseconds on the tracer's clock (steady, shared by every process on the machine).
int64_t now_us();

// The track named `name` in this process, created on first use. Same name, same track.
int track(const std::string& name);
// The calling thread's own track ("thread N" unless named with set_thread_name).
int thread_track();
void set_thread_name(const std::string& name);

struct Event {
  std::string name;
  std::string category;
  int track = 0;
  int64_t start_us = 0;
  int64_t duration_us = 0;
  std::string args_json;  // "" or the body of a JSON object: "\"bytes\": 1024"
};

// A finished span [start_us, start_us + duration_us) on `track`. No-op when off.
void record(std::string name, std::string category, int track, int64_t start_us, int64_t duration_us,
            std::string args_json = "");

// RAII: a span from construction to destruction, on the constructing thread's track
// unless `track` is given.
class Span {
 public:
  Span(const char* name, const char* category, int track = -1);
  Span(std::string name, const char* category, int track = -1);
  ~Span();
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  bool on_;
  std::string name_;
  const char* category_;
  int track_;
  int64_t start_us_ = 0;
};

// What has been recorded so far (for tests and tools), in recording order.
std::vector<Event> events();
// The recorded events as a Chrome trace JSON document.
std::string to_json();
// Writes to_json() to `path` atomically: a reader never sees half a file.
void write(const std::string& path);
// Writes to the path given to enable() / LOOM_TRACE, if any.
void flush();

// See Note [LOOM_TRACE]: the file this process writes for `path`.
std::string path_for_rank(const std::string& path);

}  // namespace loom::trace
