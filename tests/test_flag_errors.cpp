// Bad input on every program's command line, as a new user types it: each ends in one
// "error:" line naming the flag and exit status 1, never an abort, a run of some other
// length or an error found after training. The number flags are read from each program's
// --help, so a flag added without a range in its table fails here (train/flags.h); the
// path flags are given a file where a folder is needed, a missing folder and a read-only
// one (Note [Path flags are checked first], train/path_flags.h). Under loomrun the error
// is said once (Note [One error, once], train/flags.cpp).
//
// Mutation checks (by hand, see the commit): the --checkpoint-dir rule removed gives the
// filesystem_error's own line, which names no flag; a range removed from the table makes
// its flag run (or fail elsewhere) with -99999; report_flag_error printing on every rank
// fails the loomrun case.
#include <doctest/doctest.h>

#include <unistd.h>  // defines: access

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "process_launch.h"  // defines: Launch, Result, TempDir, path_from_env, contains, under_loomrun

using namespace loom::testing;
namespace fs = std::filesystem;

namespace {

// How many lines of `text` hold `part`.
int lines_with(const std::string& text, const std::string& part) {
  std::istringstream in(text);
  int n = 0;
  for (std::string line; std::getline(in, line);) n += contains(line, part) ? 1 : 0;
  return n;
}

// `command` must stop with status 1 and one "error:" line that names `flag` and holds `says`.
void check_refused(const std::string& command, const std::string& flag, const std::string& says = "") {
  CAPTURE(command);
  const Result r = Launch(command).finish();
  INFO(r.output);
  CHECK(r.code == 1);
  CHECK(lines_with(r.output, "error:") == 1);
  const size_t at = r.output.find("error:");
  const std::string line = at == std::string::npos ? "" : r.output.substr(at, r.output.find('\n', at) - at);
  CHECK(contains(line, flag));
  CHECK(contains(r.output, says));
  CHECK_FALSE(contains(r.output, "terminate called"));
}

// The flags `program --help` lists with a number value: "  --name N" or "  --name X".
std::vector<std::string> number_flags(const std::string& program) {
  const Result help = Launch(program + " --help").finish();
  REQUIRE(help.code == 0);
  std::vector<std::string> names;
  std::istringstream in(help.output);
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::string name, type;
    if (words >> name >> type && name.rfind("--", 0) == 0 && (type == "N" || type == "X")) names.push_back(name);
  }
  return names;
}

// A folder this process cannot add entries to, by the code's own test (access W_OK | X_OK):
// a fresh one made read-only, unless this process passes permission bits (root), then
// /proc/self, which takes no new entries from anyone; "" where neither holds.
std::string read_only_folder(const TempDir& dir) {
  const fs::path folder = dir.path / "read-only";
  fs::create_directory(folder);
  fs::permissions(folder, fs::perms::owner_read | fs::perms::owner_exec);
  if (::access(folder.c_str(), W_OK | X_OK) != 0) return folder.string();
  if (::access("/proc/self", W_OK | X_OK) != 0) return "/proc/self";
  return "";
}

// A run that, were a check missing, would train briefly rather than for hours.
std::string short_run(const std::string& flags) {
  return path_from_env("TRAIN_CIFAR10") + " --model tiny --synthetic --batch-size 8 --eval-limit 8 --max-steps 1 "
         "--threads 1 --workers 0 --quiet " + flags;
}

}  // namespace

TEST_CASE("every number flag of train_cifar10, airbench and mesh refuses a value out of its range, and a non-number") {
  for (const char* env : {"TRAIN_CIFAR10", "AIRBENCH", "MESH"}) {
    const std::string program = path_from_env(env);
    const std::vector<std::string> flags = number_flags(program);
    CAPTURE(program);
    REQUIRE(flags.size() >= 5);
    for (const std::string& flag : flags) {
      check_refused(program + " " + flag + " -99999", flag, "expected");
      check_refused(program + " " + flag + " many", flag, "expected");
    }
  }
  // The ones a user met: "the whole run" for a negative count, a failure inside the schedule for 0 epochs.
  const std::string airbench = path_from_env("AIRBENCH");
  check_refused(airbench + " --max-steps -5", "--max-steps", "expected -1 (the whole run) or 0 or more, got -5");
  check_refused(airbench + " --epochs 0", "--epochs", "expected a positive length in epochs");
  check_refused(path_from_env("MESH") + " --parameter 9,-6", "--parameter", "two positive integers");
}

TEST_CASE("the minimal programs and demo_mlp refuse a bad --max-steps in one line") {
  for (const char* env : {"DDP_MINIMAL", "DP_MINIMAL", "MODEL_PARALLEL_MINIMAL", "PIPELINE_MINIMAL", "FSDP_MINIMAL",
                          "TP_MINIMAL", "VIT_MINIMAL", "DEMO_MLP"}) {
    const std::string program = path_from_env(env);
    for (const char* value : {" -5", " many", " 99999999999999999999", ""})
      check_refused(program + " --max-steps" + value, "--max-steps", "expected");
  }
}

TEST_CASE("path flags: a file where a folder is needed, a missing folder, a read-only one") {
  TempDir dir("loom_path_flags");
  const std::string file = (dir.path / "file").string();
  std::ofstream(file) << "not a checkpoint";
  const std::string folder = dir.path.string(), missing = (dir.path / "missing").string();
  const std::string read_only = read_only_folder(dir);

  check_refused(short_run("--checkpoint-dir " + file), "--checkpoint-dir", "is a file; expected a folder");
  check_refused(short_run("--checkpoint-dir " + file + "/ckpt"), "--checkpoint-dir", file + " is a file, not a folder");
  check_refused(short_run("--save " + missing + "/w.safetensors"), "--save", "its folder " + missing + " does not exist");
  check_refused(short_run("--save " + folder), "--save", "is a folder; expected a file to write");
  check_refused(short_run("--metrics-json " + missing + "/m.json"), "--metrics-json", "does not exist");
  check_refused(short_run("--metrics-json " + file + "/m.json"), "--metrics-json", file + " is a file, not a folder");
  check_refused(short_run("--init " + missing), "--init", "no such file");
  check_refused(short_run("--init " + folder), "--init", "is a folder; expected a file");
  const std::string trainer = path_from_env("TRAIN_CIFAR10");
  check_refused(trainer + " --data " + file, "--data", "it is a file; expected a folder");
  check_refused(trainer + " --data " + missing, "--data", "no such directory");

  const std::string airbench = path_from_env("AIRBENCH");
  check_refused(airbench + " --metrics-json " + missing + "/m.json", "--metrics-json", "does not exist");
  check_refused(airbench + " --data " + file, "--data", "it is a file; expected a folder");

  const std::string convert = path_from_env("DCP_CONVERT");
  check_refused(convert + " to-sharded " + missing + " " + folder + "/step", "IN", "no such file");
  check_refused(convert + " to-sharded " + file + " " + file, "STEP_DIR", "is a file; expected a folder");
  check_refused(convert + " to-file " + folder + " " + folder, "OUT", "is a folder; expected a file to write");
  check_refused(convert + " to-file " + folder + " " + missing + "/w.safetensors", "OUT", "does not exist");

  if (read_only.empty()) {
    MESSAGE("no read-only folder here (this process may write into any, and into /proc/self): cases skipped");
    return;
  }
  check_refused(short_run("--checkpoint-dir " + read_only), "--checkpoint-dir", "cannot write into it");
  check_refused(short_run("--checkpoint-dir " + read_only + "/ckpt"), "--checkpoint-dir", "cannot be made in " + read_only);
  check_refused(short_run("--save " + read_only + "/w.safetensors"), "--save", "cannot write into its folder");
  check_refused(airbench + " --metrics-json " + read_only + "/m.json", "--metrics-json", "cannot write into its folder");
  check_refused(convert + " to-sharded " + file + " " + read_only + "/step", "STEP_DIR", "cannot be made in");
}

TEST_CASE("under loomrun, a command-line error is said once: local rank 0 says it, the other rank points to it") {
  TempDir dir("loom_flag_once");
  const std::string file = (dir.path / "file").string();
  std::ofstream(file) << "";
  const std::string trainer = path_from_env("TRAIN_CIFAR10");
  struct Case {
    std::string command, says;
  };
  const Case cases[] = {
      {trainer + " --mode ddp --lr -1", "--lr: expected 0 or more, got -1"},                       // a range
      {trainer + " --mode ddp --checkpoint-dir " + file, "--checkpoint-dir " + file + ": is a file"},  // a path
      {trainer + " --tp 3", "the parallel degrees multiply to 3"},                                 // the degrees
      {path_from_env("AIRBENCH") + " --max-steps -5", "--max-steps: expected -1"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.command);
    const Result r = Launch(under_loomrun(2, c.command)).finish();
    INFO(r.output);
    CHECK(r.code == 1);
    CHECK(lines_with(r.output, "error:") == 1);
    CHECK(lines_with(r.output, c.says) == 1);
    // Rank 1 points to it, unless loomrun stopped it first (rank 0 failed, the job is over).
    CHECK(lines_with(r.output, "rank 1: stopped by the command-line error that local rank 0 printed") <= 1);
    CHECK(contains(r.output, "failed: worker rank 0"));  // loomrun's summary names the rank that said why
    CHECK(r.seconds < 9);  // rank 1 was stopped, not left to wait
  }
}
