// Multi-node jobs across real "hosts": network namespaces made by scripts/two_hosts.sh,
// each with its own interface, address and host name, joined by a bridge (netns_hosts.h).
// Rendezvous on host 0's address, Gloo over TCP between the hosts.
//  - DDP, FSDP, --pp 2 x DDP and --tp 2 x DDP on 2 hosts x 2 processes, and DDP on 3
//    hosts, train the same weights, to the bit, as the same world on one host.
//  - Faults: a host lost (every process SIGKILLed) mid-run, with and without
//    --max-restarts; a cable unplugged for 3 s (the run rides through) and for longer
//    than the timeout (every rank fails naming the other side; the checkpoint is intact
//    and resumes to the uninterrupted weights); a store where nothing listens.
//  - Launching: loomrun --rdzv-endpoint (static and c10d), Slurm's and Open MPI's
//    variables with one node per host, and a host name that resolves to nothing.
// Needs root and network namespaces; elsewhere every case is skipped, saying why.
// meson passes LOOMRUN, TRAIN_CIFAR10 and TWO_HOSTS (the script's path).
#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "netns_hosts.h"     // defines: Hosts, netns_unavailable
#include "process_launch.h"  // defines: Launch, Result, TempDir, path_from_env, contains, read_file
#include "saved_weights.h"   // defines: check_same_weights

namespace fs = std::filesystem;
using namespace loom::testing;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

const bool kNoNamespaces = !netns_unavailable().empty();

// Tiny, synthetic, one thread: seconds per run. No --quiet where a test reads progress.
const std::string kCommon = " --model tiny --synthetic --batch-size 8 --eval-limit 16 --threads 1 --workers 0";

std::string trainer(const std::string& flags) { return path_from_env("TRAIN_CIFAR10") + flags + kCommon; }

// loomrun on node `node` of `nodes`, `nproc` workers, the store on host0 (torchrun's static
// rendezvous, as on a cluster).
std::string loomrun(int node, int nodes, int nproc, const std::string& extra = "") {
  return path_from_env("LOOMRUN") + " --nnodes " + std::to_string(nodes) + " --node_rank " + std::to_string(node) +
         " --nproc_per_node " + std::to_string(nproc) + " --master_addr host0 --master_port 29500" + extra + " ";
}

// Runs `command(host)` on every host at once; each must exit 0. Returns the outputs.
std::vector<std::string> run_on_hosts(const Hosts& hosts, int count, const std::function<std::string(int)>& command) {
  std::vector<std::unique_ptr<Launch>> nodes;
  for (int h = count - 1; h >= 0; --h) nodes.push_back(std::make_unique<Launch>(hosts.on(h, command(h))));
  std::vector<std::string> outputs(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    Result r = nodes[size_t(i)]->finish();
    REQUIRE_MESSAGE(r.code == 0, "host ", count - 1 - i, ": ", r.output);
    outputs[size_t(count - 1 - i)] = r.output;
  }
  return outputs;
}

// The weights of `flags` on one host, `ranks` workers of one loomrun; made once per flags.
std::string one_host_weights(const fs::path& dir, const std::string& flags, int ranks) {
  static std::map<std::string, std::string> made;
  const std::string key = flags + " x" + std::to_string(ranks);
  if (made.count(key)) return made[key];
  const std::string path = (dir / ("one_host_" + std::to_string(made.size()) + ".safetensors")).string();
  Result r = Launch(under_loomrun(ranks, trainer(flags + " --quiet --save " + path))).finish();
  REQUIRE_MESSAGE(r.code == 0, r.output);
  return made[key] = path;
}

// A reference directory that outlives the test cases (one_host_weights caches paths).
const TempDir& reference_dir() {
  static TempDir dir("loom_multihost_ref");
  return dir;
}

bool has_checkpoint(const fs::path& dir) { return fs::exists(dir / "checkpoint.safetensors"); }

void wait_for(const std::function<bool()>& condition, const char* what) {
  const auto until = Clock::now() + 120s;
  while (!condition()) {
    REQUIRE_MESSAGE(Clock::now() < until, "waited 120 s for ", what);
    std::this_thread::sleep_for(10ms);
  }
}

double since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

}  // namespace

TEST_CASE("network namespaces on this machine") {
  if (kNoNamespaces) MESSAGE("multi-host cases are skipped: ", netns_unavailable());
}

TEST_CASE("DDP, FSDP, --pp 2 x DDP, --tp 2 x DDP on 2 hosts x 2 processes: one host's weights, bit for bit" *
          doctest::skip(kNoNamespaces)) {
  TempDir dir("loom_multihost");
  for (const std::string mode : {" --mode ddp", " --mode fsdp", " --pp 2 --dp-replicate 2 --microbatches 2",
                                 " --tp 2 --dp-replicate 2"}) {
    CAPTURE(mode);
    const std::string flags = mode + " --max-steps 3";
    Hosts hosts(2);
    const std::string weights = (dir.path / "two_hosts.safetensors").string();
    auto outputs = run_on_hosts(hosts, 2, [&](int h) {
      return "LOOM_DISTRIBUTED_DEBUG=info " + loomrun(h, 2, 2) + trainer(flags + " --quiet --save " + weights);
    });
    check_same_weights(one_host_weights(reference_dir().path, flags, 4), weights);
    // The world's group spans the hosts, so its collectives went over TCP, and rank 0
    // listened on its host's own address (its host name resolves to it).
    CHECK_MESSAGE(contains(outputs[0], "gloo group 'default_pg/0': rank 0 listens on host0 (this host's name, which "
                                       "resolves to " + hosts.address(0) + "); collectives over tcp"), outputs[0]);
  }
}

TEST_CASE("DDP on 3 hosts x 1 process: one host's weights, bit for bit" * doctest::skip(kNoNamespaces)) {
  TempDir dir("loom_multihost");
  const std::string flags = " --mode ddp --max-steps 3", weights = (dir.path / "three.safetensors").string();
  Hosts hosts(3);
  run_on_hosts(hosts, 3, [&](int h) { return loomrun(h, 3, 1) + trainer(flags + " --quiet --save " + weights); });
  check_same_weights(one_host_weights(reference_dir().path, flags, 3), weights);
}

TEST_CASE("a host name that resolves to nothing: ranks listen on the address that reaches MASTER_ADDR" *
          doctest::skip(kNoNamespaces)) {
  // As in a container whose /etc/hosts lacks its name (Note [Which address a rank gives
  // Gloo], gloo_address.h). Each host renames itself inside its namespace.
  TempDir dir("loom_multihost");
  const std::string weights = (dir.path / "w.safetensors").string();
  Hosts hosts(2);
  auto outputs = run_on_hosts(hosts, 2, [&](int h) {
    return "hostname nameless" + std::to_string(h) + " && LOOM_DISTRIBUTED_DEBUG=info " + loomrun(h, 2, 1) +
           trainer(" --mode ddp --max-steps 2 --quiet --save " + weights);
  });
  CHECK_MESSAGE(contains(outputs[0], "rank 0 listens on " + hosts.address(0) + " (the address this host reaches "
                                     "MASTER_ADDR=host0 from (its host name 'nameless0' does not resolve))"),
                outputs[0]);
  CHECK(fs::exists(weights));
}

TEST_CASE("loomrun --rdzv-endpoint, static and c10d, across hosts: one host's weights" *
          doctest::skip(kNoNamespaces)) {
  TempDir dir("loom_multihost");
  const std::string flags = " --mode ddp --max-steps 3";
  const std::string reference = one_host_weights(reference_dir().path, flags, 4);
  const std::string static_weights = (dir.path / "static.safetensors").string();
  const std::string c10d_weights = (dir.path / "c10d.safetensors").string();
  {
    Hosts hosts(2);  // torchrun's static rendezvous: the endpoint is the store
    run_on_hosts(hosts, 2, [&](int h) {
      return path_from_env("LOOMRUN") + " --nnodes 2:2 --node-rank " + std::to_string(h) +
             " --nproc-per-node 2 --rdzv-endpoint host0:29411 " + trainer(flags + " --quiet --save " + static_weights);
    });
  }
  {
    Hosts hosts(2);  // torchrun's recommended form: no node ranks, every node the same line
    auto outputs = run_on_hosts(hosts, 2, [&](int) {
      return path_from_env("LOOMRUN") + " --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint "
             "host0:29400 --rdzv-id job7 " + trainer(flags + " --quiet --save " + c10d_weights);
    });
  }
  check_same_weights(reference, static_weights);
  check_same_weights(reference, c10d_weights);
}

TEST_CASE("Slurm's and Open MPI's variables, one node per host: one host's weights" * doctest::skip(kNoNamespaces)) {
  // srun and mpirun start every task themselves; each host starts its 2 tasks here.
  TempDir dir("loom_multihost");
  const std::string flags = " --mode ddp --max-steps 3";
  const std::string reference = one_host_weights(reference_dir().path, flags, 4);
  const std::string clean = "env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u MASTER_ADDR -u MASTER_PORT ";
  auto two_tasks = [&](int host, const std::string& vars, const std::string& weights) {
    std::string script;
    for (int local = 0; local < 2; ++local) {
      const std::string rank = std::to_string(2 * host + local), id = std::to_string(local);
      std::string v = vars;
      for (auto [from, to] : {std::pair<std::string, std::string>{"{rank}", rank}, {"{local}", id},
                              {"{node}", std::to_string(host)}})
        for (size_t at; (at = v.find(from)) != std::string::npos;) v.replace(at, from.size(), to);
      script += clean + v + " " + trainer(flags + " --quiet --save " + weights) + " & p" + id + "=$!; ";
    }
    return script + "wait $p0 && wait $p1";
  };
  const std::string slurm = (dir.path / "slurm.safetensors").string(), mpi = (dir.path / "mpi.safetensors").string();
  {
    // The store's host is the first of the compressed node list, its port 15000 + the job
    // id's last four digits (parallel/comm/launch_env.h).
    Hosts hosts(2);
    auto outputs = run_on_hosts(hosts, 2, [&](int h) {
      return two_tasks(h, "SLURM_JOB_ID=4242 SLURM_STEP_NODELIST='host[0-1]' SLURM_NTASKS=4 "
                          "SLURM_NTASKS_PER_NODE=2 SLURM_NODEID={node} SLURM_PROCID={rank} SLURM_LOCALID={local}",
                       slurm);
    });
    CHECK_MESSAGE(contains(outputs[0], "MASTER_ADDR=host0 MASTER_PORT=19242"), outputs[0]);
  }
  {
    Hosts hosts(2);  // mpirun -x MASTER_ADDR=host0 (Open MPI names no store)
    run_on_hosts(hosts, 2, [&](int h) {
      return two_tasks(h, "MASTER_ADDR=host0 OMPI_COMM_WORLD_SIZE=4 OMPI_COMM_WORLD_LOCAL_SIZE=2 "
                          "OMPI_COMM_WORLD_RANK={rank} OMPI_COMM_WORLD_LOCAL_RANK={local}",
                       mpi);
    });
  }
  check_same_weights(reference, slurm);
  check_same_weights(reference, mpi);
}

// ---- faults ----------------------------------------------------------------------------

// DDP with checkpoints every 4 steps; `timeout` is --comm-timeout.
const std::string kFaultRun = " --mode ddp --max-steps 32";
std::string checkpointed_run(const fs::path& dir, int timeout_s, const std::string& run = kFaultRun) {
  return trainer(run + " --comm-timeout " + std::to_string(timeout_s) + " --checkpoint-dir " + (dir / "ckpt").string() +
                 " --checkpoint-every 4 --save " + (dir / "final.safetensors").string());
}

// Marks the processes of one test's job, so that it can tell when they run (their
// environment, in /proc, is visible across network namespaces).
std::string fresh_mark() { return "LOOM_TEST_MARK=" + std::to_string(std::random_device{}()); }

// Whether a process with both of these environment entries runs now.
bool runs_with(const std::string& mark, const std::string& entry) {
  for (const auto& process : fs::directory_iterator("/proc")) {
    const std::string name = process.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(process.path() / "environ", std::ios::binary);
    const std::string env((std::istreambuf_iterator<char>(in)), {});
    if (env.find('\0' + mark + '\0') != std::string::npos && env.find('\0' + entry + '\0') != std::string::npos)
      return true;
  }
  return false;
}

TEST_CASE("a host lost mid-run, no restarts: every rank left exits within the timeout, naming the lost host" *
          doctest::skip(kNoNamespaces)) {
  TempDir dir("loom_multihost");
  Hosts hosts(2);
  const std::string job = checkpointed_run(dir.path, 10, " --mode ddp --max-steps 400");  // killed long before the end
  Launch node1(hosts.on(1, loomrun(1, 2, 2, " --grace_period 1") + job));
  Launch node0(hosts.on(0, loomrun(0, 2, 2, " --grace_period 1") + job));
  wait_for([&] { return has_checkpoint(dir.path / "ckpt"); }, "the first checkpoint");
  hosts.kill(1);
  const auto lost = Clock::now();
  Result r0 = node0.finish();
  CHECK(since(lost) < 10);  // the collective timeout; the peers' resets make it ~the roll call's 2.5 s
  CHECK(r0.code != 0);
  CHECK_MESSAGE(contains(r0.output, "Ranks 2, 3 (on host1) did not answer a roll call"), r0.output);
  CHECK_MESSAGE(contains(r0.output, "loomrun: failed: worker rank "), r0.output);
  CHECK(!fs::exists(dir.path / "final.safetensors"));
  node1.finish();
}

TEST_CASE("a host lost mid-run, --max-restarts 2: host 0 restarts, host 1 comes back, same weights bit for bit" *
          doctest::skip(kNoNamespaces)) {
  // Note [A node that comes back] (parallel/launcher/rendezvous.h).
  TempDir dir("loom_multihost");
  const std::string reference = one_host_weights(reference_dir().path, kFaultRun, 4);
  Hosts hosts(2);
  const std::string mark = fresh_mark(), job = checkpointed_run(dir.path, 15);
  const std::string restarts = " --max-restarts 2 --grace_period 1";
  Launch node1(hosts.on(1, mark + " " + loomrun(1, 2, 2, restarts) + job));
  Launch node0(hosts.on(0, mark + " " + loomrun(0, 2, 2, restarts) + job));
  wait_for([&] { return has_checkpoint(dir.path / "ckpt"); }, "the first checkpoint");
  hosts.kill(1);
  node1.finish();
  // Host 1 returns once host 0's loomrun has restarted its workers, as an operator would
  // restart a lost machine's loomrun, with the same command line.
  wait_for([&] { return runs_with(mark, "LOOM_RESTART_COUNT=1"); }, "host 0's second attempt");
  Launch back(hosts.on(1, mark + " " + loomrun(1, 2, 2, restarts) + job));
  Result r1 = back.finish(), r0 = node0.finish();
  REQUIRE_MESSAGE(r0.code == 0, r0.output);
  REQUIRE_MESSAGE(r1.code == 0, r1.output);
  CHECK_MESSAGE(contains(r0.output, "Ranks 2, 3 (on host1) did not answer a roll call"), r0.output);
  CHECK_MESSAGE(contains(r0.output, "restarting all 2 workers (restart 1 of --max-restarts 2)"), r0.output);
  CHECK_MESSAGE(contains(r1.output, "the job is at restart attempt 1"), r1.output);
  CHECK_MESSAGE(contains(r0.output, "resumed from "), r0.output);
  check_same_weights(reference, (dir.path / "final.safetensors").string());
}

TEST_CASE("a cable unplugged for 3 s mid-run, timeout 20 s: the run rides through, same weights bit for bit" *
          doctest::skip(kNoNamespaces)) {
  // TCP retransmits what the cut link dropped; every collective waits within its timeout.
  TempDir dir("loom_multihost");
  const std::string reference = one_host_weights(reference_dir().path, kFaultRun, 4);
  Hosts hosts(2);
  const std::string job = checkpointed_run(dir.path, 20);
  Launch node1(hosts.on(1, loomrun(1, 2, 2) + job));
  Launch node0(hosts.on(0, loomrun(0, 2, 2) + job));
  wait_for([&] { return has_checkpoint(dir.path / "ckpt"); }, "the first checkpoint");
  hosts.link(1, false);
  std::this_thread::sleep_for(3s);
  hosts.link(1, true);
  CHECK(!fs::exists(dir.path / "final.safetensors"));  // the cut came before the end
  Result r0 = node0.finish(), r1 = node1.finish();
  REQUIRE_MESSAGE(r0.code == 0, r0.output);
  REQUIRE_MESSAGE(r1.code == 0, r1.output);
  check_same_weights(reference, (dir.path / "final.safetensors").string());
}

TEST_CASE("a cable unplugged for longer than the timeout: every rank fails naming the other side; the checkpoint "
          "is intact and resumes to the uninterrupted weights" * doctest::skip(kNoNamespaces)) {
  TempDir dir("loom_multihost");
  const std::string reference = one_host_weights(reference_dir().path, kFaultRun, 4);
  {
    Hosts hosts(2);
    const std::string job = checkpointed_run(dir.path, 3);
    Launch node1(hosts.on(1, loomrun(1, 2, 2, " --grace_period 1") + job));
    Launch node0(hosts.on(0, loomrun(0, 2, 2, " --grace_period 1") + job));
    wait_for([&] { return has_checkpoint(dir.path / "ckpt"); }, "the first checkpoint");
    hosts.link(1, false);
    const auto cut = Clock::now();
    Result r0 = node0.finish(), r1 = node1.finish();
    const double exited_after = since(cut);
    hosts.link(1, true);
    // The timeout (3 s), the roll call (0.75 s; the store's connect on host 1: 0.75 s),
    // loomrun's grace period (1 s), and a margin.
    CHECK(exited_after < 8);
    CHECK(r0.code != 0);
    CHECK(r1.code != 0);
    CHECK_MESSAGE(contains(r0.output, "failed: timed out after 3000 ms"), r0.output);
    CHECK_MESSAGE(contains(r0.output, "Ranks 2, 3 (on host1) did not answer a roll call"), r0.output);
    CHECK_MESSAGE(contains(r1.output, "failed: timed out after 3000 ms"), r1.output);
    CHECK_MESSAGE(contains(r1.output, "The store at host0:29500 (served by rank 0's process) cannot be reached"),
                  r1.output);
    CHECK(!fs::exists(dir.path / "final.safetensors"));
  }
  // Nothing half-written: the last checkpoint resumes, on two hosts again, to the
  // uninterrupted run's weights.
  Hosts hosts(2);
  auto outputs = run_on_hosts(hosts, 2, [&](int h) { return loomrun(h, 2, 2) + checkpointed_run(dir.path, 20) +
                                                            " --resume"; });
  CHECK_MESSAGE(contains(outputs[0], "resumed from "), outputs[0]);
  check_same_weights(reference, (dir.path / "final.safetensors").string());
}

TEST_CASE("a store where nothing listens, or an address nobody has: a clear error within the timeout" *
          doctest::skip(kNoNamespaces)) {
  Hosts hosts(2);
  const std::string job = trainer(" --mode ddp --max-steps 2 --quiet --comm-timeout 3");
  const auto start = Clock::now();
  // host0 exists but runs nothing; 10.213.0.99 is on the hosts' network but is no host.
  Launch refused(hosts.on(1, loomrun(1, 2, 1) + job));
  Launch nobody(hosts.on(1, path_from_env("LOOMRUN") + " --nnodes 2 --node_rank 1 --nproc_per_node 1 "
                                                       "--master_addr 10.213.0.99 --master_port 29500 " + job));
  Result a = refused.finish(), b = nobody.finish();
  CHECK(since(start) < 10);
  CHECK(a.code != 0);
  CHECK(b.code != 0);
  CHECK_MESSAGE(contains(a.output, "could not connect to the store at host0:29500 within"), a.output);
  CHECK_MESSAGE(contains(a.output, "(timeout 3000 ms; last error: Connection refused)"), a.output);
  CHECK_MESSAGE(contains(b.output, "could not connect to the store at 10.213.0.99:29500 within"), b.output);
  CHECK_MESSAGE(contains(b.output, "(timeout 3000 ms; last error: "), b.output);
}
