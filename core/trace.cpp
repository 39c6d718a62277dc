#include "core/trace.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <mutex>
#include <sstream>

#include "core/atomic_file.h"  // defines: write_file_atomically
#include "core/error.h"

namespace loom::trace {

namespace detail {
std::atomic<bool> g_enabled{false};
}  // namespace detail

namespace {

// A bound on memory for a trace left on by mistake: ~100 bytes an event.
constexpr size_t kMaxEvents = 2'000'000;

struct State {
  std::mutex mutex;
  std::vector<Event> events;
  std::vector<std::string> track_names;  // track id = index + 1 (Chrome shows tid 0 oddly)
  std::string path;                      // written at exit and by flush()
  bool atexit_registered = false;
  size_t dropped = 0;
};

// Never destroyed: the exit handler and late spans of other threads may still use it.
State& state() {
  static State* s = new State;
  return *s;
}

thread_local int t_track = 0;  // 0: not assigned yet

// The first of `names` that is set and not empty, else null. A process's rank and the
// number of processes come from whichever launcher started it: loomrun / torchrun (RANK,
// WORLD_SIZE), Open MPI's mpirun, or Slurm's srun, in the order init_process_group reads
// them (parallel/comm/launch_env.h; core reads the variables itself, it sits below parallel).
const char* first_env(std::initializer_list<const char*> names) {
  for (const char* name : names)
    if (const char* value = std::getenv(name); value && *value) return value;
  return nullptr;
}

const char* rank_env() { return first_env({"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"}); }
const char* world_env() { return first_env({"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"}); }

int rank_from_env() {
  const char* rank = rank_env();
  return rank ? std::atoi(rank) : 0;
}

std::string escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buffer[8];
          std::snprintf(buffer, sizeof(buffer), "\\u%04x", c);
          out += buffer;
        } else {
          out += c;
        }
    }
  }
  return out;
}

int track_locked(State& s, const std::string& name) {
  for (size_t i = 0; i < s.track_names.size(); ++i)
    if (s.track_names[i] == name) return static_cast<int>(i) + 1;
  s.track_names.push_back(name);
  return static_cast<int>(s.track_names.size());
}

void write_at_exit() {
  try {
    flush();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom: LOOM_TRACE: %s\n", e.what());
  }
}

// See Note [LOOM_TRACE].
struct EnableFromEnvironment {
  EnableFromEnvironment() {
    const char* path = std::getenv("LOOM_TRACE");
    if (path && *path) enable(path_for_rank(path));
  }
} g_enable_from_environment;

}  // namespace

void enable() { detail::g_enabled.store(true, std::memory_order_relaxed); }

void enable(const std::string& path) {
  State& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.path = path;
    if (!s.path.empty() && !s.atexit_registered) {
      std::atexit(write_at_exit);
      s.atexit_registered = true;
    }
  }
  detail::g_enabled.store(true, std::memory_order_relaxed);
}

void disable() { detail::g_enabled.store(false, std::memory_order_relaxed); }

void clear() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.events.clear();
  s.dropped = 0;
}

int64_t now_us() {
  using namespace std::chrono;
  return duration_cast<microseconds>(steady_clock::now().time_since_epoch()).count();
}

int track(const std::string& name) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return track_locked(s, name);
}

int thread_track() {
  if (t_track == 0) {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    // A name no other thread can have; set_thread_name renames the track.
    s.track_names.push_back("thread " + std::to_string(s.track_names.size() + 1));
    t_track = static_cast<int>(s.track_names.size());
  }
  return t_track;
}

void set_thread_name(const std::string& name) {
  const int id = thread_track();
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.track_names[static_cast<size_t>(id) - 1] = name;
}

void record(std::string name, std::string category, int track_id, int64_t start_us, int64_t duration_us,
            std::string args_json) {
  if (!enabled()) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.events.size() >= kMaxEvents) {
    ++s.dropped;
    return;
  }
  s.events.push_back(Event{std::move(name), std::move(category), track_id, start_us, duration_us,
                           std::move(args_json)});
}

Span::Span(const char* name, const char* category, int track_id) : Span(std::string(), category, track_id) {
  if (on_) name_ = name;
}

Span::Span(std::string name, const char* category, int track_id)
    : on_(enabled()), category_(category), track_(track_id) {
  if (!on_) return;
  name_ = std::move(name);
  if (track_ < 0) track_ = thread_track();
  start_us_ = now_us();
}

Span::~Span() {
  if (on_) record(std::move(name_), category_, track_, start_us_, now_us() - start_us_);
}

std::vector<Event> events() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.events;
}

std::string to_json() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  const int pid = rank_from_env();
  std::ostringstream out;
  out << "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  out << "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " << pid << ", \"args\": {\"name\": \"rank " << pid
      << "\"}}";
  for (size_t i = 0; i < s.track_names.size(); ++i) {
    out << ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": " << pid << ", \"tid\": " << i + 1
        << ", \"args\": {\"name\": \"" << escape(s.track_names[i]) << "\"}}";
    out << ",\n{\"name\": \"thread_sort_index\", \"ph\": \"M\", \"pid\": " << pid << ", \"tid\": " << i + 1
        << ", \"args\": {\"sort_index\": " << i + 1 << "}}";
  }
  for (const Event& e : s.events) {
    out << ",\n{\"name\": \"" << escape(e.name) << "\", \"cat\": \"" << escape(e.category)
        << "\", \"ph\": \"X\", \"ts\": " << e.start_us << ", \"dur\": " << e.duration_us << ", \"pid\": " << pid
        << ", \"tid\": " << e.track;
    if (!e.args_json.empty()) out << ", \"args\": {" << e.args_json << "}";
    out << "}";
  }
  out << "\n]";
  if (s.dropped > 0) out << ", \"loom_dropped_events\": " << s.dropped;
  out << "}\n";
  return out.str();
}

void write(const std::string& path) {
  LOOM_CHECK(!path.empty(), "trace::write: expected a file path, got an empty string");
  write_file_atomically(path, to_json(), "trace::write");  // Note [Atomic files]: a viewer never sees half
}

void flush() {
  std::string path;
  {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    path = s.path;
  }
  if (!path.empty()) write(path);
}

std::string path_for_rank(const std::string& path) {
  const char* rank = rank_env();
  const char* world = world_env();
  const std::string r = rank ? rank : "0";
  if (auto at = path.find("{rank}"); at != std::string::npos) return path.substr(0, at) + r + path.substr(at + 6);
  if (!(rank && world && std::atoi(world) > 1)) return path;
  const std::filesystem::path p(path);
  return (p.parent_path() / (p.stem().string() + ".rank" + r + p.extension().string())).string();
}

}  // namespace loom::trace
