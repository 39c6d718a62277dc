// The Chrome-trace tracer: spans, tracks, the JSON it writes, and that it costs nothing off.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/trace.h"
#include "nn/json.h"

using namespace loom;

TEST_CASE("off: spans record nothing; on: spans, explicit records and named tracks") {
  trace::disable();
  trace::clear();
  { trace::Span span("ignored", "test"); }
  trace::record("ignored too", "test", 1, 0, 1);
  CHECK(trace::events().empty());

  trace::enable();
  {
    trace::Span outer("outer", "test");
    trace::Span inner(std::string("inner ") + "1", "test");
  }
  const int comm = trace::track("comm (rank 0)");
  CHECK(trace::track("comm (rank 0)") == comm);
  trace::record("all_reduce bucket 0", "ddp", comm, 100, 50, "\"bytes\": 1024");
  trace::disable();
  auto events = trace::events();
  REQUIRE(events.size() == 3);
  CHECK(events[0].name == "inner 1");  // inner ends first
  CHECK(events[1].name == "outer");
  CHECK(events[0].track == events[1].track);
  CHECK(events[0].track == trace::thread_track());
  CHECK(events[1].start_us <= events[0].start_us);
  CHECK(events[0].start_us + events[0].duration_us <= events[1].start_us + events[1].duration_us);
  CHECK(events[2].track == comm);
  CHECK(events[2].args_json == "\"bytes\": 1024");
  trace::clear();
}

TEST_CASE("each thread gets its own track") {
  int main_track = trace::thread_track(), other_track = 0;
  std::thread([&] { other_track = trace::thread_track(); }).join();
  CHECK(other_track != main_track);
}

TEST_CASE("the JSON is a Chrome trace: metadata names the tracks, spans are complete events") {
  trace::clear();
  trace::enable();
  trace::set_thread_name("main \"thread\"");  // quotes must be escaped
  { trace::Span span("forward", "train"); }
  trace::disable();
  json::Value doc = json::parse(trace::to_json());
  const json::Value& events = doc["traceEvents"];
  bool named = false, span = false;
  for (size_t i = 0; i < events.as_array().size(); ++i) {
    const json::Value& e = events[i];
    if (e["ph"].as_string() == "M" && e["name"].as_string() == "thread_name" &&
        e["args"]["name"].as_string() == "main \"thread\"")
      named = true;
    if (e["ph"].as_string() == "X" && e["name"].as_string() == "forward") {
      span = true;
      CHECK(e["cat"].as_string() == "train");
      CHECK(e["dur"].as_int() >= 0);
      CHECK(e["tid"].as_int() == trace::thread_track());
    }
  }
  CHECK(named);
  CHECK(span);
  trace::clear();
}

TEST_CASE("write is atomic and flush writes to the enable() path") {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("loom_trace_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  trace::clear();
  trace::enable((dir / "t.json").string());
  { trace::Span span("step", "train"); }
  trace::disable();
  trace::flush();
  std::ifstream in(dir / "t.json");
  std::stringstream text;
  text << in.rdbuf();
  CHECK(json::parse(text.str())["traceEvents"].as_array().size() >= 2);
  size_t files = 0;
  for (const auto& entry : fs::directory_iterator(dir)) files += entry.is_regular_file();
  CHECK(files == 1);  // no temporary left behind
  trace::enable("");  // nothing to write at exit
  trace::disable();
  CHECK_THROWS_WITH_AS(trace::write((dir / "missing" / "t.json").string()), doctest::Contains("cannot create"), Error);
  fs::remove_all(dir);
  trace::clear();
}

TEST_CASE("LOOM_TRACE paths: one file per rank") {
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
  CHECK(trace::path_for_rank("out/trace.json") == "out/trace.json");
  ::setenv("RANK", "1", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  CHECK(trace::path_for_rank("out/trace.json") == "out/trace.rank1.json");
  CHECK(trace::path_for_rank("trace") == "trace.rank1");
  CHECK(trace::path_for_rank("t-{rank}.json") == "t-1.json");
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
  // Started by srun or mpirun instead: their variables name the file.
  ::setenv("SLURM_PROCID", "2", 1);
  ::setenv("SLURM_NTASKS", "3", 1);
  CHECK(trace::path_for_rank("out/trace.json") == "out/trace.rank2.json");
  ::setenv("OMPI_COMM_WORLD_RANK", "1", 1);  // Open MPI first, as init_process_group reads them
  ::setenv("OMPI_COMM_WORLD_SIZE", "3", 1);
  CHECK(trace::path_for_rank("out/trace.json") == "out/trace.rank1.json");
  for (const char* name : {"SLURM_PROCID", "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"})
    ::unsetenv(name);
}

TEST_CASE("a span costs next to nothing while tracing is off") {
  trace::disable();
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 1'000'000; ++i) trace::Span span("hot loop", "test");
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(seconds < 0.5);  // ~ a nanosecond each; generous for a loaded machine
  CHECK(trace::events().empty());
}
