#include "parallel/launcher/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <sched.h>

#include "parallel/launcher/cpu_binding.h"
#include "parallel/launcher/prefixed_output.h"
#include "parallel/launcher/rendezvous.h"
#include "parallel/system_error.h"  // defines: LOOM_CHECK_ERRNO

extern char** environ;

namespace loom::launcher {

using Clock = std::chrono::steady_clock;

namespace {

struct Stream {
  int fd = -1;       // read end of the worker's pipe; -1 once closed
  int target = -1;   // loomrun's own stdout or stderr
  std::unique_ptr<LinePrefixer> prefixer;
};

struct Worker {
  int local_rank = 0;
  int rank = 0;
  std::vector<int> cpus;  // --numa-binding exclusive: its CPUs; empty: not bound
  pid_t pid = -1;
  bool running = false;
  int status = 0;  // from waitpid, once it exited
  Stream streams[2];
};

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) + ")" +
           (WCOREDUMP(status) ? ", core dumped" : "");
  return "ended with wait status " + std::to_string(status);
}

int exit_code_of(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

void say(const std::string& line) { write_fully(STDERR_FILENO, "loomrun: " + line + "\n"); }

class Supervisor {
 public:
  explicit Supervisor(const LaunchOptions& o) : o_(o), job_(o) {}
  int run();

 private:
  // One attempt: starts every worker, supervises until all are reaped. See Note [How
  // loomrun restarts a job].
  void run_attempt();
  std::vector<std::string> environment_for(const Worker& w) const;
  void spawn(Worker& w);
  void reap();
  void stop_all(int signal, const std::string& why);
  void kill_group(const Worker& w, int signal);
  void pump(Stream& s);
  bool any_running() const;
  void reap_descendants();

  const LaunchOptions& o_;
  LaunchOptions job_;   // o_ with this attempt's node rank and store (the rendezvous's)
  // See Note [A node that comes back] (rendezvous.h). Made once the signals are blocked:
  // the meeting point's server thread must not take the SIGCHLD that signalfd reads.
  std::unique_ptr<Rendezvous> meeting_;
  int attempt_ = 0;     // 0 for the first start; LOOM_RESTART_COUNT
  std::vector<Worker> workers_;
  sigset_t original_mask_{};
  int signal_fd_ = -1;
  bool stopping_ = false;
  Clock::time_point kill_at_{};
  bool killed_ = false;
  int failed_index_ = -1;  // the first worker that failed
  int interrupted_by_ = 0;
};

std::vector<std::string> Supervisor::environment_for(const Worker& w) const {
  std::vector<std::pair<std::string, std::string>> ours = {
      {"MASTER_ADDR", job_.master_addr},
      {"MASTER_PORT", std::to_string(job_.master_port)},
      {"RANK", std::to_string(w.rank)},
      {"LOCAL_RANK", std::to_string(w.local_rank)},
      {"WORLD_SIZE", std::to_string(o_.world_size())},
      {"LOCAL_WORLD_SIZE", std::to_string(o_.nproc_per_node)},
      {"GROUP_RANK", std::to_string(job_.node_rank)},
      // The attempt, under loom's name and torchrun's: a training script resumes from its
      // checkpoint when it is above 0 (train/checkpoint.h).
      {"LOOM_RESTART_COUNT", std::to_string(attempt_)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(attempt_)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(o_.max_restarts)},
  };
  // Several workers on one node each start an OpenMP team; without a limit they
  // oversubscribe the cores and every one of them slows down (torchrun sets 1).
  if (!std::getenv("OMP_NUM_THREADS") && o_.nproc_per_node > 1) {
    long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
    ours.emplace_back("OMP_NUM_THREADS", std::to_string(std::max(1L, cores / o_.nproc_per_node)));
  }
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string entry = *e;
    std::string name = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const auto& [key, value] : ours) replaced = replaced || key == name;
    if (!replaced) env.push_back(entry);
  }
  for (const auto& [key, value] : ours) env.push_back(key + "=" + value);
  return env;
}

void Supervisor::spawn(Worker& w) {
  // Everything the child needs is built before fork(): after it, the child only makes
  // async-signal-safe calls.
  std::vector<std::string> env = environment_for(w);
  std::vector<char*> envp, argv;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> command = o_.command;
  for (auto& a : command) argv.push_back(a.data());
  argv.push_back(nullptr);

  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  for (int c : w.cpus) CPU_SET(c, &cpus);

  int pipes[2][2] = {{-1, -1}, {-1, -1}};
  for (int s = 0; s < 2; ++s)
    if (o_.prefix_streams & (1 << s)) LOOM_CHECK_ERRNO(::pipe2(pipes[s], O_CLOEXEC) == 0, "pipe2() for worker output");
  // exec failure pipe: closed by a successful exec (O_CLOEXEC), or carries the errno.
  int exec_status[2];
  LOOM_CHECK_ERRNO(::pipe2(exec_status, O_CLOEXEC) == 0, "pipe2() for the exec status");
  const pid_t parent = ::getpid();

  pid_t pid = ::fork();
  LOOM_CHECK_ERRNO(pid >= 0, "fork() for worker rank ", w.rank);
  if (pid == 0) {
    ::setpgid(0, 0);  // See Note [How loomrun stops a job]
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);  // loomrun died before prctl took effect
    ::signal(SIGPIPE, SIG_DFL);
    ::sigprocmask(SIG_SETMASK, &original_mask_, nullptr);
    if (!w.cpus.empty() && ::sched_setaffinity(0, sizeof(cpus), &cpus) != 0) {
      int error = -errno;  // negative: the binding failed, not the exec
      ssize_t ignored = ::write(exec_status[1], &error, sizeof(error));
      (void)ignored;
      ::_exit(127);
    }
    for (int s = 0; s < 2; ++s)
      if (pipes[s][1] >= 0) ::dup2(pipes[s][1], s + 1);  // stdout is 1, stderr 2; dup2 clears O_CLOEXEC
    ::execvpe(argv[0], argv.data(), envp.data());
    int error = errno;
    ssize_t ignored = ::write(exec_status[1], &error, sizeof(error));
    (void)ignored;
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here, so the group exists before we might signal it
  w.pid = pid;
  w.running = true;
  ::close(exec_status[1]);
  for (int s = 0; s < 2; ++s) {
    if (pipes[s][0] < 0) continue;
    ::close(pipes[s][1]);
    w.streams[s] = Stream{pipes[s][0], s + 1, std::make_unique<LinePrefixer>("[rank " + std::to_string(w.rank) + "]: ")};
  }
  int error = 0;
  ssize_t n;
  do n = ::read(exec_status[0], &error, sizeof(error));
  while (n < 0 && errno == EINTR);
  ::close(exec_status[0]);
  if (n > 0 && error < 0) {
    LOOM_FAIL("cannot bind rank ", w.rank, " to CPUs ", cpu_list_string(w.cpus), " (--numa-binding exclusive): "
              "sched_setaffinity: ", std::strerror(-error));
  }
  if (n > 0) {
    LOOM_FAIL("cannot run '", o_.command[0], "' for rank ", w.rank, ": ", std::strerror(error),
              ". Check the program's path (a program in the current directory needs ./) and that it is executable");
  }
}

void Supervisor::kill_group(const Worker& w, int signal) {
  // ESRCH: the group is already empty, which is what we want.
  if (::kill(-w.pid, signal) != 0 && errno != ESRCH && errno != EPERM)
    say("could not signal rank " + std::to_string(w.rank) + ": " + std::strerror(errno));
}

void Supervisor::stop_all(int signal, const std::string& why) {
  if (!stopping_) {
    stopping_ = true;
    kill_at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o_.grace_period_s));
    if (any_running()) say(why);
  }
  for (const auto& w : workers_)
    if (w.running) kill_group(w, signal);
}

void Supervisor::reap() {
  while (true) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid < 0 && errno == EINTR) continue;
    if (pid <= 0) return;  // nothing more now (or ECHILD: no children left)
    for (size_t i = 0; i < workers_.size(); ++i) {
      Worker& w = workers_[i];
      if (w.pid != pid) continue;
      w.running = false;
      w.status = status;
      kill_group(w, SIGKILL);  // whatever it started goes with it
      bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      if (failed && !stopping_ && failed_index_ < 0) {
        failed_index_ = static_cast<int>(i);
        say("worker rank " + std::to_string(w.rank) + " (local rank " + std::to_string(w.local_rank) + ", pid " +
            std::to_string(pid) + ") " + describe_status(status));
        stop_all(SIGTERM, detail::str("stopping the other workers (SIGTERM, then SIGKILL after ",
                                      o_.grace_period_s, " s)"));
      }
    }
  }
}

void Supervisor::pump(Stream& s) {
  char buffer[64 * 1024];
  ssize_t n = ::read(s.fd, buffer, sizeof(buffer));
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {  // end of stream (or a broken pipe, which ends it just the same)
    write_fully(s.target, s.prefixer->finish());
    ::close(s.fd);
    s.fd = -1;
    return;
  }
  write_fully(s.target, s.prefixer->feed(buffer, static_cast<size_t>(n)));
}

// After the workers: anything still alive below loomrun is a descendant that left its
// worker's process group (setsid) and was re-parented here. Kill and reap it.
void Supervisor::reap_descendants() {
  const auto until = Clock::now() + std::chrono::seconds(2);
  while (true) {
    int status;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid < 0 && errno == EINTR) continue;
    if (pid < 0) return;  // ECHILD: nobody left
    if (pid > 0) continue;
    std::ifstream children("/proc/self/task/" + std::to_string(::getpid()) + "/children");
    for (pid_t child; children >> child;) ::kill(child, SIGKILL);
    if (Clock::now() >= until) {
      say("some processes started by the workers could not be reaped");
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

bool Supervisor::any_running() const {
  for (const auto& w : workers_)
    if (w.running) return true;
  return false;
}

int Supervisor::run() {
  sigset_t handled;
  sigemptyset(&handled);
  for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&handled, s);
  LOOM_CHECK_ERRNO(::sigprocmask(SIG_BLOCK, &handled, &original_mask_) == 0, "sigprocmask()");
  signal_fd_ = ::signalfd(-1, &handled, SFD_CLOEXEC);
  LOOM_CHECK_ERRNO(signal_fd_ >= 0, "signalfd()");
  ::signal(SIGPIPE, SIG_IGN);  // a closed stdout must not kill loomrun and orphan the workers
  // Orphaned descendants of the workers become loomrun's children, not init's, so that
  // loomrun can kill and reap them too. See Note [How loomrun stops a job].
  LOOM_CHECK_ERRNO(::prctl(PR_SET_CHILD_SUBREAPER, 1) == 0, "prctl(PR_SET_CHILD_SUBREAPER)");

  std::vector<std::string> restarts;  // why each restart happened, for the last word
  auto history = [&] {
    std::string text;
    for (size_t i = 0; i < restarts.size(); ++i) text += (i ? "; " : "") + restarts[i];
    return text;
  };
  auto plural = [](size_t n) { return std::to_string(n) + (n == 1 ? " restart" : " restarts"); };
  try {
    meeting_ = std::make_unique<Rendezvous>(o_);
  } catch (const std::exception& e) {
    say(e.what());
    return 1;
  }
  const int first = meeting_->first_attempt();
  if (first > 0)
    say(detail::str("the job is at restart attempt ", first, " (", first, " of --max-restarts ", o_.max_restarts,
                    " used): this node joins it there"));
  for (attempt_ = first;; ++attempt_) {
    run_attempt();
    if (failed_index_ < 0 || interrupted_by_ || attempt_ >= o_.max_restarts) break;
    const Worker& w = workers_[failed_index_];
    restarts.push_back(detail::str("attempt ", attempt_, ": worker rank ", w.rank, " ", describe_status(w.status)));
    say(detail::str("restarting all ", workers_.size(), " workers (restart ", attempt_ + 1, " of --max-restarts ",
                    o_.max_restarts, ") after worker rank ", w.rank, " ", describe_status(w.status)));
  }
  ::close(signal_fd_);

  if (failed_index_ == -2) return 1;  // could not start a worker; already said why
  if (failed_index_ >= 0) {
    const Worker& w = workers_[failed_index_];
    say("failed: worker rank " + std::to_string(w.rank) + " (local rank " + std::to_string(w.local_rank) + ") " +
        describe_status(w.status) + "; its output above shows why" +
        (o_.max_restarts > 0 ? " (after " + plural(restarts.size()) + " of --max-restarts " +
                                   std::to_string(o_.max_restarts) + (restarts.empty() ? "" : ": " + history()) + ")"
                             : ""));
    return exit_code_of(w.status) == 0 ? 1 : exit_code_of(w.status);
  }
  if (interrupted_by_) return 128 + interrupted_by_;
  if (!restarts.empty()) say("all workers exited 0 after " + plural(restarts.size()) + " (" + history() + ")");
  return 0;
}

void Supervisor::run_attempt() {
  workers_.clear();
  workers_.resize(o_.nproc_per_node);
  stopping_ = false;
  killed_ = false;
  failed_index_ = -1;
  try {
    std::vector<std::vector<int>> cpu_sets;  // See Note [Why bind DDP workers to cores]
    if (o_.numa_binding == "exclusive") cpu_sets = exclusive_cpu_sets(allowed_cpus(), o_.nproc_per_node);
    const Placement at = meeting_->join(attempt_);
    job_.node_rank = at.node_rank;
    job_.master_addr = at.master_addr;
    job_.master_port = at.master_port;
    for (int i = 0; i < o_.nproc_per_node; ++i) {
      workers_[i].local_rank = i;
      workers_[i].rank = job_.global_rank(i);
      if (!cpu_sets.empty()) workers_[i].cpus = cpu_sets[size_t(i)];
      spawn(workers_[i]);
    }
  } catch (const std::exception& e) {
    say(e.what());
    stop_all(SIGKILL, "stopping the workers already started");
    failed_index_ = -2;
  }

  // Loop until every worker is reaped and every output pipe has reached its end.
  auto drain_until = Clock::time_point::max();
  while (true) {
    std::vector<pollfd> fds = {{signal_fd_, POLLIN, 0}};
    std::vector<Stream*> streams;
    for (auto& w : workers_)
      for (auto& s : w.streams)
        if (s.fd >= 0) {
          fds.push_back({s.fd, POLLIN, 0});
          streams.push_back(&s);
        }
    bool running = any_running();
    if (!running && streams.empty()) break;
    auto now = Clock::now();
    if (!running && drain_until == Clock::time_point::max()) drain_until = now + std::chrono::seconds(2);
    if (!running && now >= drain_until) {
      // Only a descendant that escaped its process group can hold a pipe open now.
      for (auto* s : streams) ::close(s->fd), s->fd = -1;
      continue;
    }
    auto deadline = running ? (stopping_ && !killed_ ? kill_at_ : Clock::time_point::max()) : drain_until;
    int timeout_ms = deadline == Clock::time_point::max()
                         ? -1
                         : static_cast<int>(std::max<int64_t>(
                               0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count() + 1));
    int n = ::poll(fds.data(), fds.size(), timeout_ms);
    if (n < 0 && errno == EINTR) continue;
    LOOM_CHECK_ERRNO(n >= 0, "poll() in loomrun");
    if (fds[0].revents & POLLIN) {
      signalfd_siginfo info{};
      ssize_t got = ::read(signal_fd_, &info, sizeof(info));
      if (got == sizeof(info) && info.ssi_signo != SIGCHLD) {
        int sig = static_cast<int>(info.ssi_signo);
        if (interrupted_by_ == SIGINT && sig == SIGINT) {
          kill_at_ = Clock::now();  // a second Ctrl-C: no more grace
        } else {
          if (!interrupted_by_) interrupted_by_ = sig;
          stop_all(sig, std::string("received ") + strsignal(sig) + "; forwarding it to the workers");
        }
      }
      reap();  // SIGCHLD, or any signal: reaping is cheap and never blocks
    }
    for (size_t i = 1; i < fds.size(); ++i)
      if (fds[i].revents) pump(*streams[i - 1]);
    if (stopping_ && !killed_ && any_running() && Clock::now() >= kill_at_) {
      killed_ = true;
      say("workers still running after the grace period; sending SIGKILL");
      for (const auto& w : workers_)
        if (w.running) kill_group(w, SIGKILL);
    }
  }
  reap_descendants();
}

}  // namespace

int run_workers(const LaunchOptions& options) { return Supervisor(options).run(); }

}  // namespace loom::launcher
