#include "parallel/launcher/options.h"

#include <cerrno>
#include <climits>
#include <cstdlib>

#include "core/error.h"

namespace loom::launcher {

const char* launch_usage() {
  return R"(usage: loomrun [options] PROGRAM [ARGS...]

Starts nproc_per_node copies of PROGRAM on this node, as torchrun does, each with
RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set, so
that loom::distributed::init_process_group() finds its peers. If one worker fails,
the others are stopped (SIGTERM, then SIGKILL after the grace period) and loomrun
exits non-zero naming the failed rank. SIGINT/SIGTERM are forwarded to the workers.

options:
  --nproc_per_node N   workers on this node (default 1)
  --nnodes N           number of nodes (default 1)
  --node_rank R        this node's index, 0 ... nnodes-1 (default 0); RANK = R * nproc_per_node + LOCAL_RANK
  --master_addr A      address of the node running rank 0, which serves the store (default 127.0.0.1)
  --master_port P      the store's port on that node (default 29500)
  --standalone         single node: pick a free port for the store (ignores --master_addr/--master_port)
  --rdzv_backend B     static (default): every node gives --node_rank, the store is at the master
                       address; c10d: node ranks by arrival at --rdzv_endpoint, no --node_rank
  --rdzv_endpoint H[:P]
                       static: the master address and port (H:P, as --master_addr H --master_port P);
                       c10d: where the nodes meet (port 29400 by default); the loomrun on host H
                       serves the meeting point, and node rank 0 serves the workers' store
  --rdzv_id ID         c10d: the job's name at the meeting point (default none)
  --rdzv_conf join_timeout=S
                       c10d: seconds to wait for the meeting point (default 600)
  --tee N              prefix each output line with "[rank N]: ": 1 stdout, 2 stderr, 3 both
  --prefix-output      same as --tee 3
  --grace_period S     seconds between SIGTERM and SIGKILL when stopping workers (default 5)
  --max_restarts N     after a worker fails and the others are stopped, start all workers
                       again, up to N times (default 0); each sees the attempt in
                       LOOM_RESTART_COUNT and TORCHELASTIC_RESTART_COUNT
  --numa-binding exclusive
                       bind each worker to its own share of loomrun's CPUs (split in order,
                       disjoint); helps DDP when every core trains. Default: no binding
  -h, --help           this text

Options may be written --nproc-per-node as well, and as --option=value.
If OMP_NUM_THREADS is unset and nproc_per_node > 1, each worker gets
OMP_NUM_THREADS = (CPU cores / nproc_per_node), so that workers do not oversubscribe cores.
)";
}

static int parse_int(const std::string& option, const std::string& text, int min, int max) {
  char* end = nullptr;
  errno = 0;
  long value = std::strtol(text.c_str(), &end, 10);
  LOOM_CHECK(!text.empty() && *end == '\0' && errno == 0 && value >= min && value <= max, "loomrun: ", option,
             " expects an integer in [", min, ", ", max, "], got '", text, "'");
  return static_cast<int>(value);
}

LaunchOptions parse_launch_options(int argc, const char* const* argv) {
  LaunchOptions o;
  bool master_given = false;
  int i = 1;
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.rfind("-", 0) != 0) break;  // the program
    if (arg == "-h" || arg == "--help") {
      o.help = true;
      return o;
    }
    // --name=value or --name value; '-' and '_' are the same inside a name.
    std::string name = arg, value;
    bool has_value = false;
    if (auto eq = arg.find('='); eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      has_value = true;
    }
    for (size_t k = 2; k < name.size(); ++k)
      if (name[k] == '-') name[k] = '_';
    auto take_value = [&]() -> std::string {
      if (has_value) return value;
      LOOM_CHECK(i + 1 < argc, "loomrun: ", name, " expects a value; see loomrun --help");
      return argv[++i];
    };
    if (name == "--standalone" || name == "--prefix_output") {
      LOOM_CHECK(!has_value, "loomrun: ", name, " takes no value, got '", value, "'");
      if (name == "--standalone") o.standalone = true;
      else o.prefix_streams = 3;
    } else if (name == "--nproc_per_node") {
      o.nproc_per_node = parse_int(name, take_value(), 1, 4096);
    } else if (name == "--nnodes") {
      std::string text = take_value();
      if (auto colon = text.find(':'); colon != std::string::npos) {  // torchrun's MIN:MAX
        LOOM_CHECK(text.substr(0, colon) == text.substr(colon + 1), "loomrun: --nnodes ", text, ": a loom job has a "
                   "fixed number of nodes (no elastic membership between MIN and MAX); give one number, or MIN:MAX "
                   "with MIN = MAX");
        text = text.substr(0, colon);
      }
      o.nnodes = parse_int(name, text, 1, 65536);
    } else if (name == "--node_rank") {
      o.node_rank = parse_int(name, take_value(), 0, INT_MAX);
      o.node_rank_given = true;
    } else if (name == "--rdzv_backend") {
      o.rdzv_backend = take_value();
      LOOM_CHECK(o.rdzv_backend == "static" || o.rdzv_backend == "c10d", "loomrun: --rdzv_backend expects static or "
                 "c10d, got '", o.rdzv_backend, "' (etcd backends are not supported)");
    } else if (name == "--rdzv_endpoint") {
      o.rdzv_endpoint = take_value();
      LOOM_CHECK(!o.rdzv_endpoint.empty(), "loomrun: --rdzv_endpoint expects HOST[:PORT], got ''");
    } else if (name == "--rdzv_id") {
      o.rdzv_id = take_value();
      LOOM_CHECK(!o.rdzv_id.empty() && o.rdzv_id.find('/') == std::string::npos, "loomrun: --rdzv_id expects a name "
                 "without '/', got '", o.rdzv_id, "'");
    } else if (name == "--rdzv_conf") {
      const std::string conf = take_value();
      const std::string key = "join_timeout=";
      LOOM_CHECK(conf.rfind(key, 0) == 0, "loomrun: --rdzv_conf: loomrun knows join_timeout=SECONDS, got '", conf,
                 "'");
      o.rdzv_join_timeout_s = parse_int(name, conf.substr(key.size()), 1, 86400);
    } else if (name == "--master_addr") {
      o.master_addr = take_value();
      LOOM_CHECK(!o.master_addr.empty(), "loomrun: --master_addr expects a host name or address, got ''");
      master_given = true;
    } else if (name == "--master_port") {
      o.master_port = parse_int(name, take_value(), 1, 65535);
      master_given = true;
    } else if (name == "--max_restarts") {
      o.max_restarts = parse_int(name, take_value(), 0, 1000000);
    } else if (name == "--tee") {
      o.prefix_streams = parse_int(name, take_value(), 0, 3);
    } else if (name == "--grace_period") {
      std::string text = take_value();
      char* end = nullptr;
      o.grace_period_s = std::strtod(text.c_str(), &end);
      LOOM_CHECK(!text.empty() && *end == '\0' && o.grace_period_s >= 0, "loomrun: --grace_period expects seconds "
                 ">= 0, got '", text, "'");
    } else if (name == "--numa_binding") {
      o.numa_binding = take_value();
      LOOM_CHECK(o.numa_binding == "exclusive", "loomrun: --numa-binding '", o.numa_binding, "' is not supported; "
                 "loomrun knows 'exclusive' (each worker its own CPUs). torchrun's node, socket and core-complex "
                 "follow each worker's GPU to its NUMA node, which loomrun does not look up");
    } else {
      LOOM_FAIL("loomrun: unknown option '", arg, "'; see loomrun --help");
    }
  }
  for (; i < argc; ++i) o.command.emplace_back(argv[i]);
  LOOM_CHECK(!o.command.empty(), "loomrun: no program given; usage: loomrun [options] PROGRAM [ARGS...]");
  if (o.rdzv_backend == "static" && !o.rdzv_endpoint.empty()) {
    LOOM_CHECK(!master_given, "loomrun: --rdzv_endpoint and --master_addr/--master_port both name the store; give "
               "one of them");
    const auto colon = o.rdzv_endpoint.rfind(':');
    LOOM_CHECK(colon != std::string::npos && colon > 0, "loomrun: --rdzv_endpoint '", o.rdzv_endpoint, "' needs a "
               "port with --rdzv_backend static (HOST:PORT, as torchrun)");
    o.master_addr = o.rdzv_endpoint.substr(0, colon);
    o.master_port = parse_int("--rdzv_endpoint's port", o.rdzv_endpoint.substr(colon + 1), 1, 65535);
    master_given = true;
  }
  if (o.rdzv_backend == "c10d") {
    LOOM_CHECK(!o.rdzv_endpoint.empty(), "loomrun: --rdzv_backend c10d needs --rdzv_endpoint HOST[:PORT], the "
               "address where the nodes meet");
    LOOM_CHECK(!o.standalone, "loomrun: --standalone picks its own store; drop --rdzv_backend c10d");
    LOOM_CHECK(!o.node_rank_given, "loomrun: with --rdzv_backend c10d the node ranks are given out at the "
               "rendezvous, in order of arrival; drop --node_rank (or use --rdzv_backend static)");
    LOOM_CHECK(!master_given, "loomrun: with --rdzv_backend c10d node rank 0 picks the workers' store address "
               "and port; drop --master_addr/--master_port");
  }
  LOOM_CHECK(o.node_rank < o.nnodes, "loomrun: --node_rank ", o.node_rank, " is out of range for --nnodes ", o.nnodes,
             "; node ranks run from 0 to ", o.nnodes - 1);
  LOOM_CHECK(!o.standalone || o.nnodes == 1, "loomrun: --standalone is for a single node, but --nnodes is ",
             o.nnodes, "; drop --standalone and give every node the same --master_addr and --master_port");
  LOOM_CHECK(!o.standalone || !master_given, "loomrun: --standalone picks the store's address and port itself; "
             "drop --master_addr/--master_port, or drop --standalone");
  return o;
}

}  // namespace loom::launcher
