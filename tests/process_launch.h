// Tests that start real programs (loomrun, train_cifar10) through the shell and read
// what they print. meson passes the programs' paths in environment variables.
//
//   Result r = Launch(path_from_env("LOOMRUN") + " --nproc_per_node 2 prog").finish();
//   CHECK(r.code == 0);
//   CHECK(contains(r.output, "rank 1"));
#pragma once

#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "temp_dir.h"  // defines: TempDir

namespace loom::testing {

// The value of an environment variable that tests/meson.build sets, or a failed REQUIRE
// saying so.
inline std::string path_from_env(const char* name) {
  const char* v = std::getenv(name);
  REQUIRE_MESSAGE(v != nullptr, std::string(name), " is not set; run this test through `meson test` (tests/meson.build sets it)");
  return v;
}

struct Result {
  int code = -1;        // exit status; -1 when killed by a signal
  std::string output;   // stdout and stderr, interleaved
  double seconds = 0;   // from start to exit
};

// Starts `command` through the shell (popen); finish() collects its output and status.
struct Launch {
  FILE* pipe = nullptr;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();

  explicit Launch(const std::string& command) {
    pipe = ::popen((command + " 2>&1").c_str(), "r");
    REQUIRE(pipe != nullptr);
  }
  Result finish() {
    Result r;
    char buffer[4096];
    size_t n;
    while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) r.output.append(buffer, n);
    int status = ::pclose(pipe);
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return r;
  }
};

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// `command` as `ranks` workers of one loomrun on this machine (the LOOMRUN environment
// variable names the launcher): "loomrun --standalone --nproc_per_node N command".
inline std::string under_loomrun(int ranks, const std::string& command) {
  return path_from_env("LOOMRUN") + " --standalone --nproc_per_node " + std::to_string(ranks) + " " + command;
}

// The command line of train_cifar10 (the TRAIN_CIFAR10 environment variable names it) with `flags`: one
// process, or `ranks` workers of one loomrun.
inline std::string trainer_command(int ranks, const std::string& flags) {
  const std::string program = path_from_env("TRAIN_CIFAR10") + " " + flags;
  return ranks == 1 ? program : under_loomrun(ranks, program);
}

// Runs `command` with --save DIR/NAME.safetensors, which must succeed; the weights' path.
inline std::string run_saving_weights(const TempDir& dir, const std::string& command, const std::string& name) {
  const std::string path = (dir.path / (name + ".safetensors")).string();
  Result r = Launch(command + " --save " + path).finish();
  REQUIRE_MESSAGE(r.code == 0, r.output);
  return path;
}

// A file's bytes (the saved weights two runs must agree on to the bit); "" if it is missing.
inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace loom::testing
