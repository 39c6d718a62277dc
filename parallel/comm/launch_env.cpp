#include "parallel/comm/launch_env.h"

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "core/error.h"  // defines: LOOM_CHECK, LOOM_FAIL

extern char** environ;

namespace loom::distributed {

namespace {

const std::string* find(const Environment& env, const char* name) {
  auto it = env.find(name);
  return it == env.end() || it->second.empty() ? nullptr : &it->second;
}

long long parse_integer(const std::string& text, const std::string& what, long long min, long long max) {
  char* end = nullptr;
  errno = 0;
  long long value = std::strtoll(text.c_str(), &end, 10);
  LOOM_CHECK(!text.empty() && *end == '\0' && errno == 0 && value >= min && value <= max, what, ": expected an "
             "integer in [", min, ", ", max, "], got '", text, "'");
  return value;
}

int env_int(const Environment& env, const char* name, int min = 0) {
  return static_cast<int>(parse_integer(*find(env, name), name, min, INT_MAX));
}

// One host expression (between top-level commas): "a[1-2]b[3,5]" -> a1b3 a1b5 a2b3 a2b5,
// appended to `out` until it holds max_hosts.
void expand_one(const std::string& expr, std::vector<std::string>& out, size_t max_hosts) {
  std::vector<std::string> partial = {""};
  size_t i = 0;
  while (i < expr.size()) {
    if (expr[i] != '[') {
      size_t next = expr.find('[', i);
      std::string literal = expr.substr(i, next == std::string::npos ? std::string::npos : next - i);
      LOOM_CHECK(literal.find(']') == std::string::npos, "Slurm host list '", expr, "': ']' without '['");
      for (auto& p : partial) p += literal;
      i = next == std::string::npos ? expr.size() : next;
      continue;
    }
    size_t close = expr.find(']', i);
    LOOM_CHECK(close != std::string::npos, "Slurm host list '", expr, "': '[' without ']'");
    std::string inside = expr.substr(i + 1, close - i - 1);
    LOOM_CHECK(!inside.empty() && inside.find('[') == std::string::npos, "Slurm host list '", expr,
               "': expected ranges like [01-04,07] inside brackets, got [", inside, "]");
    std::vector<std::string> values;
    size_t start = 0;
    while (start <= inside.size()) {
      size_t comma = inside.find(',', start);
      std::string range = inside.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      size_t dash = range.find('-');
      std::string lo = range.substr(0, dash), hi = dash == std::string::npos ? lo : range.substr(dash + 1);
      auto digits = [](const std::string& s) {
        return !s.empty() && s.size() <= 18 && s.find_first_not_of("0123456789") == std::string::npos;
      };
      LOOM_CHECK(digits(lo) && digits(hi), "Slurm host list '", expr, "': expected a number or a range like 01-04, "
                 "got '", range, "'");
      long long a = std::stoll(lo), b = std::stoll(hi);
      LOOM_CHECK(a <= b, "Slurm host list '", expr, "': range ", range, " runs backwards");
      for (long long v = a; v <= b && values.size() < max_hosts; ++v) {  // the first max_hosts are enough
        std::string number = std::to_string(v);
        if (number.size() < lo.size()) number.insert(0, lo.size() - number.size(), '0');  // node01 stays node01
        values.push_back(std::move(number));
      }
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    std::vector<std::string> product;
    for (size_t a = 0; a < partial.size() && product.size() < max_hosts; ++a)
      for (size_t b = 0; b < values.size() && product.size() < max_hosts; ++b) product.push_back(partial[a] + values[b]);
    partial = std::move(product);
    i = close + 1;
  }
  for (auto& p : partial)
    if (out.size() < max_hosts) out.push_back(std::move(p));
}

// Open MPI's description of this process, or source "" when absent.
LaunchEnv read_openmpi(const Environment& env) {
  LaunchEnv e;
  if (!find(env, "OMPI_COMM_WORLD_RANK") && !find(env, "OMPI_COMM_WORLD_SIZE")) return e;
  LOOM_CHECK(find(env, "OMPI_COMM_WORLD_RANK") && find(env, "OMPI_COMM_WORLD_SIZE"), "Open MPI's variables are "
             "incomplete: OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE come together (mpirun sets both)");
  e.source = "openmpi";
  e.rank = env_int(env, "OMPI_COMM_WORLD_RANK");
  e.world_size = env_int(env, "OMPI_COMM_WORLD_SIZE", 1);
  if (find(env, "OMPI_COMM_WORLD_LOCAL_RANK")) e.local_rank = env_int(env, "OMPI_COMM_WORLD_LOCAL_RANK");
  if (find(env, "OMPI_COMM_WORLD_LOCAL_SIZE")) e.local_world_size = env_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1);
  e.master_port = 29500;  // DeepSpeed's default under mpirun, torchrun's default port
  e.master_from = "MASTER_PORT default 29500";
  return e;
}

LaunchEnv read_slurm(const Environment& env) {
  LaunchEnv e;
  if (!find(env, "SLURM_PROCID")) return e;  // salloc's shell has SLURM_NTASKS but is no task
  const char* ntasks = find(env, "SLURM_NTASKS") ? "SLURM_NTASKS" : find(env, "SLURM_NPROCS") ? "SLURM_NPROCS" : nullptr;
  LOOM_CHECK(ntasks, "Slurm's variables are incomplete: SLURM_PROCID is set but SLURM_NTASKS is not. Start the "
             "job with srun --ntasks N (or sbatch --ntasks N and srun inside)");
  e.source = "slurm";
  e.rank = env_int(env, "SLURM_PROCID");
  e.world_size = env_int(env, ntasks, 1);
  if (find(env, "SLURM_LOCALID")) e.local_rank = env_int(env, "SLURM_LOCALID");
  // --ntasks-per-node gives one number; otherwise SLURM_TASKS_PER_NODE lists every node's.
  for (const char* name : {"SLURM_NTASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
    if (!find(env, name)) continue;
    std::vector<int> per_node = expand_tasks_per_node(*find(env, name));
    size_t node = find(env, "SLURM_NODEID") ? static_cast<size_t>(env_int(env, "SLURM_NODEID")) : 0;
    if (per_node.size() == 1) node = 0;  // one number: every node has that many
    LOOM_CHECK(node < per_node.size(), name, "='", *find(env, name), "' lists ", per_node.size(),
               " nodes, but SLURM_NODEID is ", node);
    e.local_world_size = per_node[node];
    break;
  }
  for (const char* name : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
    if (!find(env, name)) continue;
    e.master_addr = expand_hostlist(*find(env, name), 1)[0];  // only the first host is needed
    e.master_from = std::string("first host of ") + name;
    break;
  }
  if (find(env, "SLURM_JOB_ID")) {
    e.master_port = port_from_slurm_job_id(*find(env, "SLURM_JOB_ID"));
    e.master_from += std::string(e.master_from.empty() ? "" : ", ") + "port from SLURM_JOB_ID";
  }
  return e;
}

}  // namespace

std::string LaunchEnv::describe() const {
  const char* name = source == "slurm" ? "Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID)"
                     : source == "openmpi" ? "Open MPI (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK)"
                                           : "RANK and WORLD_SIZE";
  return detail::str("rank ", rank, " of ", world_size, " from ", name, "; store at MASTER_ADDR=", master_addr,
                     " MASTER_PORT=", master_port, master_from.empty() ? "" : " (", master_from,
                     master_from.empty() ? "" : ")");
}

Environment process_environment() {
  Environment env;
  for (char** e = environ; e && *e; ++e) {
    std::string entry = *e;
    auto eq = entry.find('=');
    if (eq != std::string::npos) env[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  return env;
}

std::vector<std::string> expand_hostlist(const std::string& list, size_t max_hosts) {
  LOOM_CHECK(max_hosts >= 1, "expand_hostlist: max_hosts must be at least 1");
  std::vector<std::string> hosts;
  size_t start = 0;
  int depth = 0;
  for (size_t i = 0; i <= list.size(); ++i) {
    if (i < list.size() && list[i] == '[') ++depth;
    if (i < list.size() && list[i] == ']') --depth;
    LOOM_CHECK(depth >= 0 && depth <= 1, "Slurm host list '", list, "': unbalanced or nested brackets");
    if (i == list.size() || (list[i] == ',' && depth == 0)) {
      std::string expr = list.substr(start, i - start);
      LOOM_CHECK(!expr.empty(), "Slurm host list '", list, "': empty host name");
      expand_one(expr, hosts, max_hosts);
      if (hosts.size() >= max_hosts) {
        hosts.resize(max_hosts);
        return hosts;  // the caller asked for no more
      }
      start = i + 1;
    }
  }
  LOOM_CHECK(depth == 0, "Slurm host list '", list, "': '[' without ']'");
  return hosts;
}

std::vector<int> expand_tasks_per_node(const std::string& spec) {
  std::vector<int> counts;
  size_t start = 0;
  while (true) {
    size_t comma = spec.find(',', start);
    std::string item = spec.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    long long repeat = 1;
    std::string count = item;
    if (auto paren = item.find('('); paren != std::string::npos) {
      LOOM_CHECK(item.size() > paren + 3 && item.compare(paren, 2, "(x") == 0 && item.back() == ')',
                 "Slurm tasks per node '", spec, "': expected items like 4 or 2(x3), got '", item, "'");
      count = item.substr(0, paren);
      repeat = parse_integer(item.substr(paren + 2, item.size() - paren - 3), "Slurm tasks per node '" + spec + "'",
                             1, 1 << 20);
    }
    int n = static_cast<int>(parse_integer(count, "Slurm tasks per node '" + spec + "'", 0, INT_MAX));
    LOOM_CHECK(counts.size() + static_cast<size_t>(repeat) <= (1u << 20), "Slurm tasks per node '", spec,
               "': more than 2^20 nodes");
    counts.insert(counts.end(), static_cast<size_t>(repeat), n);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return counts;
}

int port_from_slurm_job_id(const std::string& job_id) {
  LOOM_CHECK(!job_id.empty() && job_id.find_first_not_of("0123456789") == std::string::npos,
             "SLURM_JOB_ID: expected a number, got '", job_id, "'; set MASTER_PORT instead");
  std::string last = job_id.size() > 4 ? job_id.substr(job_id.size() - 4) : job_id;
  return 15000 + std::stoi(last);  // 15000 ... 24999: below Linux's ephemeral ports
}

LaunchEnv read_launch_env(const Environment& env) {
  LaunchEnv mpi = read_openmpi(env), slurm = read_slurm(env);
  LaunchEnv e;
  if (find(env, "RANK") || find(env, "WORLD_SIZE")) {
    // The caller names what is missing: init_process_group may have been given it.
    e.source = "env";
    if (find(env, "RANK")) e.rank = env_int(env, "RANK");
    if (find(env, "WORLD_SIZE")) e.world_size = env_int(env, "WORLD_SIZE", 1);
    if (find(env, "LOCAL_RANK")) e.local_rank = env_int(env, "LOCAL_RANK");
    if (find(env, "LOCAL_WORLD_SIZE")) e.local_world_size = env_int(env, "LOCAL_WORLD_SIZE", 1);
  } else if (!mpi.source.empty()) {
    // See Note [Where rank and world size come from]: mpirun inside a Slurm allocation.
    LOOM_CHECK(slurm.source.empty() || slurm.world_size == mpi.world_size, "conflicting launchers: Open MPI says "
               "this is rank ", mpi.rank, " of OMPI_COMM_WORLD_SIZE=", mpi.world_size, ", Slurm says rank ", slurm.rank,
               " of SLURM_NTASKS=", slurm.world_size, ". Start the workers with one of them (srun, or mpirun "
               "--np ", slurm.world_size, "), or set RANK and WORLD_SIZE to say which is right");
    e = mpi;
  } else if (!slurm.source.empty()) {
    e = slurm;
  }
  if (const std::string* addr = find(env, "MASTER_ADDR")) {
    e.master_addr = *addr;
    e.master_from = "MASTER_ADDR";
  }
  if (const std::string* port = find(env, "MASTER_PORT")) {
    e.master_port = static_cast<int>(parse_integer(*port, "MASTER_PORT", 1, 65535));
    e.master_from += e.master_from.empty() ? "MASTER_PORT" : " and MASTER_PORT";
  }
  if (e.source == "env") e.master_from.clear();  // loomrun's own variables need no explanation
  LOOM_CHECK(e.rank < 0 || e.world_size < 0 || e.rank < e.world_size, "launch environment (", e.source,
             "): rank ", e.rank, " is not below the world size ", e.world_size);
  if (const std::string* n = find(env, "LOOM_RESTART_COUNT")) {
    e.restart_count = static_cast<int>(parse_integer(*n, "LOOM_RESTART_COUNT", 0, INT_MAX));
  } else if (const std::string* t = find(env, "TORCHELASTIC_RESTART_COUNT")) {
    e.restart_count = static_cast<int>(parse_integer(*t, "TORCHELASTIC_RESTART_COUNT", 0, INT_MAX));
  }
  return e;
}

int launch_local_rank(int fallback) {
  try {
    LaunchEnv e = read_launch_env(process_environment());
    return e.local_rank >= 0 ? e.local_rank : fallback;
  } catch (const std::exception&) {
    return fallback;  // init_process_group reports a bad environment, with the whole story
  }
}

std::shared_ptr<TCPStore> connect_store_of_attempt(const std::string& host, int port, int rank, int restart_count,
                                                   std::chrono::milliseconds timeout) {
  if (rank == 0) {
    auto store = std::make_shared<TCPStore>(host, port, /*is_server=*/true, timeout);
    store->set(kRestartCountKey, std::to_string(restart_count));
    return store;
  }
  // See Note [Restart generations].
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    std::shared_ptr<TCPStore> store;
    std::string theirs;
    try {
      store = std::make_shared<TCPStore>(host, port, /*is_server=*/false, std::max(left, std::chrono::milliseconds(1)));
      theirs = store->get(kRestartCountKey);
    } catch (const Error&) {
      // The old attempt's rank 0 exited between our connect and its reply: try again, unless
      // the time is (nearly) up: a last try of a few milliseconds would report its own
      // sliver of a timeout instead of the whole one that just ran out.
      if (std::chrono::steady_clock::now() + std::chrono::milliseconds(200) >= deadline) throw;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    const std::string mine = std::to_string(restart_count);
    if (theirs == mine) return store;
    const long long store_attempt = parse_integer(theirs, "the store's restart count", 0, LLONG_MAX);
    LOOM_CHECK(store_attempt < restart_count, "rank ", rank, " belongs to restart attempt ", restart_count,
               " (LOOM_RESTART_COUNT), but the store at ", net::endpoint(host, port), " is serving attempt ",
               store_attempt, ": this process is left over from a failed attempt and must not join the new one");
    LOOM_CHECK(std::chrono::steady_clock::now() < deadline, "rank ", rank, " of restart attempt ", restart_count,
               " waited until the timeout for rank 0 of that attempt, but the store at ", net::endpoint(host, port),
               " still serves attempt ", store_attempt, " (its rank 0 has not exited)");
    store.reset();  // the old attempt's store: wait for the new one to take the port
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace loom::distributed
