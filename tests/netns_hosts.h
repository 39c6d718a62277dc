// Hosts for one test: network namespaces made by scripts/two_hosts.sh --hold (the
// TWO_HOSTS environment variable names the script), each with its own address and host
// name, joined by a bridge. They exist while the object does.
//
//   Hosts hosts(2);
//   Launch node1(hosts.on(1, "loomrun --node_rank 1 --master_addr host0 ..."));
//   hosts.link(1, false);   // unplug host 1's cable
//   hosts.kill(1);          // SIGKILL every process of host 1
//
// The script, not this object, removes the namespaces: it does so when its standard
// input ends, which happens when this object closes the pipe, and also when the test
// process dies in any way (the kernel closes the pipe). Commands started with on() run
// inside the namespaces, so the script kills them too.
//
// Machines without network namespaces (no root, a container that forbids them) cannot
// run these tests: netns_unavailable() says why, and the tests are skipped.
#pragma once

#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "process_launch.h"  // defines: path_from_env, Launch

namespace loom::testing {

// "" when this machine makes network namespaces, else why not (the script's words).
inline const std::string& netns_unavailable() {
  static const std::string why = [] {
    const char* script = std::getenv("TWO_HOSTS");
    if (script == nullptr) return std::string("TWO_HOSTS is not set; run this test through `meson test`");
    // Plain popen: this runs at static initialisation, where doctest's assertions may not.
    FILE* pipe = ::popen((std::string("bash ") + script + " check 2>&1").c_str(), "r");
    if (pipe == nullptr) return std::string("popen failed");
    std::string output;
    char buffer[512];
    for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0;) output.append(buffer, n);
    const int status = ::pclose(pipe);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? std::string() : output;
  }();
  return why;
}

// `text` as one word for sh: single-quoted, its own single quotes escaped.
inline std::string shell_quote(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

class Hosts {
 public:
  explicit Hosts(int count) {
    const std::string script = path_from_env("TWO_HOSTS");
    int to_script[2], from_script[2];
    REQUIRE(::pipe2(to_script, O_CLOEXEC) == 0);
    REQUIRE(::pipe2(from_script, O_CLOEXEC) == 0);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::dup2(to_script[0], 0);  // dup2 clears O_CLOEXEC on the copies
      ::dup2(from_script[1], 1);
      const std::string hosts = std::to_string(count);
      ::execlp("bash", "bash", script.c_str(), "--hosts", hosts.c_str(), "--hold", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(to_script[0]);
    ::close(from_script[1]);
    hold_ = to_script[1];  // close-on-exec: commands started later do not keep the hosts alive
    std::string line;
    char c;
    while (::read(from_script[0], &c, 1) == 1 && c != '\n') line += c;
    ::close(from_script[0]);
    std::istringstream words(line);
    std::string tag;
    words >> tag >> name_;
    for (std::string address; words >> address;) addresses_.push_back(address);
    const bool made = tag == "hosts" && int(addresses_.size()) == count;
    REQUIRE_MESSAGE(made, "two_hosts.sh --hold said '", line, "'");
  }
  ~Hosts() {
    ::close(hold_);  // the script sees its input end and removes the hosts
    int status;
    ::waitpid(pid_, &status, 0);
  }
  Hosts(const Hosts&) = delete;
  Hosts& operator=(const Hosts&) = delete;

  const std::string& address(int host) const { return addresses_.at(size_t(host)); }
  // A command line that runs `command` (sh syntax) in `host`, with host name "host<N>".
  std::string on(int host, const std::string& command) const {
    return script("on " + std::to_string(host) + " " + shell_quote(command));
  }
  // Unplugs (false) or replugs (true) the cable between `host` and the bridge.
  void link(int host, bool up) const {
    Result r = Launch(script("link " + std::to_string(host) + (up ? " up" : " down"))).finish();
    REQUIRE_MESSAGE(r.code == 0, r.output);
  }
  // SIGKILL to every process of `host`: the host is lost.
  void kill(int host) const {
    Result r = Launch(script("kill " + std::to_string(host))).finish();
    REQUIRE_MESSAGE(r.code == 0, r.output);
  }

 private:
  std::string script(const std::string& args) const {
    return "bash " + path_from_env("TWO_HOSTS") + " --name " + name_ + " " + args;
  }
  pid_t pid_ = -1;
  int hold_ = -1;
  std::string name_;
  std::vector<std::string> addresses_;
};

}  // namespace loom::testing
