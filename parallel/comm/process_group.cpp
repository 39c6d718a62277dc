#include "parallel/comm/process_group.h"

#include <cctype>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "core/error.h"
#include "parallel/comm/launch_env.h"  // defines: read_launch_env, connect_store_of_attempt
#include "parallel/comm/rendezvous.h"
#ifdef LOOM_WITH_GLOO
#include "parallel/comm/gloo_address.h"  // defines: choose_gloo_address
#include "parallel/comm/gloo_communicator.h"
#endif
#ifdef LOOM_WITH_NCCL
#include "parallel/comm/nccl_communicator.h"
#endif

namespace loom::distributed {

namespace {

struct DefaultGroup {
  std::shared_ptr<TCPStore> store;
  std::shared_ptr<Communicator> comm;
  std::string prefix;
  int local_rank = 0;
  World world;  // for new_group
};

std::mutex g_mutex;
DefaultGroup g_group;
int g_groups_made = 0;  // names each group's keys in the store; the same count on every rank

constexpr const char* kLaunchHint =
    "Start the program with loomrun, which sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT for "
    "each worker:\n  loomrun --nproc_per_node 2 ./your_program\nor start it with srun (loom reads SLURM_PROCID, "
    "SLURM_NTASKS, ...) or mpirun (pass -x MASTER_ADDR=<first host>), or set these variables yourself";

int parse_int(const std::string& text, const std::string& name) {
  char* end = nullptr;
  errno = 0;
  long value = std::strtol(text.c_str(), &end, 10);
  LOOM_CHECK(!text.empty() && *end == '\0' && errno == 0 && value >= INT_MIN && value <= INT_MAX, name, "='", text,
             "' is not an integer");
  return static_cast<int>(value);
}

std::string env_or_fail(const char* name, const char* meaning) {
  const char* value = std::getenv(name);
  LOOM_CHECK(value != nullptr && *value != '\0', "init_process_group(init_method=\"env://\"): the environment "
             "variable ", name, " (", meaning, ") is not set. ", kLaunchHint);
  return value;
}

// -1 means "not given": take the environment variable, which must then exist.
int arg_or_env(int given, const char* name, const char* meaning) {
  return given >= 0 ? given : parse_int(env_or_fail(name, meaning), name);
}

DefaultGroup& group_or_fail(const char* what) {
  LOOM_CHECK(g_group.comm != nullptr, what, ": the default process group is not initialized; call "
             "loom::distributed::init_process_group() first");
  return g_group;
}

}  // namespace

std::shared_ptr<Communicator> make_communicator(const std::string& backend, std::shared_ptr<TCPStore> store,
                                                const std::string& prefix, int rank, int world_size,
                                                std::chrono::milliseconds timeout, const std::string& master_addr,
                                                int world_rank) {
  if (backend == "gloo") {
#ifdef LOOM_WITH_GLOO
    GlooOptions options;
    options.timeout = timeout;
    const GlooAddress address = choose_gloo_address(std::getenv("GLOO_SOCKET_IFNAME"), master_addr);
    options.iface = address.iface;
    options.hostname = address.hostname;
    // LOOM_GLOO_SHM=0 keeps collectives on TCP even on one host (as NCCL_SHM_DISABLE=1).
    if (const char* shm = std::getenv("LOOM_GLOO_SHM"); shm && std::string(shm) == "0") options.shared_memory = false;
    auto comm = std::make_shared<GlooCommunicator>(std::move(store), prefix, rank, world_size, options);
    std::string debug = std::getenv("LOOM_DISTRIBUTED_DEBUG") ? std::getenv("LOOM_DISTRIBUTED_DEBUG") : "";
    for (char& c : debug) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (rank == 0 && (debug == "info" || debug == "detail")) {
      std::fprintf(stderr, "loom: gloo group '%s': rank 0 listens on %s (%s); collectives over %s%s%s\n",
                   prefix.c_str(), (address.iface.empty() ? address.hostname : "interface " + address.iface).c_str(),
                   address.why.c_str(), comm->collective_transport(), comm->why_not_shared_memory().empty() ? "" : ": ",
                   comm->why_not_shared_memory().c_str());
    }
    return comm;
#else
    (void)store, (void)prefix, (void)rank, (void)world_size, (void)timeout, (void)master_addr, (void)world_rank;
    LOOM_FAIL("backend \"gloo\": this loom was built without Gloo. Install libgloo-dev and reconfigure "
              "(meson setup --reconfigure build -Dgloo=enabled)");
#endif
  }
  if (backend == "nccl") {
#ifdef LOOM_WITH_NCCL
    NcclOptions options;
    options.timeout = timeout;
    const int device = NcclCommunicator::default_device(world_rank >= 0 ? world_rank : rank);
    return std::make_shared<NcclCommunicator>(std::move(store), prefix, rank, world_size, device, options);
#else
    LOOM_FAIL("backend \"nccl\": this loom was built without NCCL (it needs the CUDA backend and NCCL 2.14+; "
              "see the 'nccl communicator' line of meson's summary). Use backend \"gloo\" with CPU tensors");
#endif
  }
  LOOM_FAIL("unknown backend \"", backend, "\"; expected \"gloo\" (CPU tensors) or \"nccl\" (CUDA tensors)");
}

void init_process_group(const std::string& backend, const std::string& init_method, std::chrono::milliseconds timeout,
                        int rank, int world_size) {
  std::lock_guard<std::mutex> lock(g_mutex);
  LOOM_CHECK(g_group.comm == nullptr, "init_process_group: the default process group is already initialized; call "
             "destroy_process_group() first");
  std::string host;
  int port = 0;
  const std::string tcp = "tcp://";
  const LaunchEnv launch = read_launch_env(process_environment());  // See Note [Where rank and world size come from]
  if (init_method == "env://") {
    host = !launch.master_addr.empty() ? launch.master_addr
                                       : env_or_fail("MASTER_ADDR", "the address of rank 0, which serves the store");
    port = launch.master_port > 0 ? launch.master_port
                                  : parse_int(env_or_fail("MASTER_PORT", "the store's port on rank 0"), "MASTER_PORT");
  } else if (init_method.rfind(tcp, 0) == 0) {
    std::string rest = init_method.substr(tcp.size());
    auto colon = rest.rfind(':');
    LOOM_CHECK(colon != std::string::npos && colon > 0, "init_process_group: expected init_method "
               "\"tcp://host:port\", got \"", init_method, "\"");
    host = rest.substr(0, colon);
    if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    port = parse_int(rest.substr(colon + 1), "the port of init_method");
  } else {
    LOOM_FAIL("init_process_group: unsupported init_method \"", init_method, "\"; expected \"env://\" or "
              "\"tcp://host:port\"");
  }
  rank = arg_or_env(rank >= 0 ? rank : launch.rank, "RANK", "this process's rank, 0 ... WORLD_SIZE-1");
  world_size = arg_or_env(world_size >= 0 ? world_size : launch.world_size, "WORLD_SIZE", "the number of processes");
  LOOM_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "init_process_group: expected 0 <= RANK < "
             "WORLD_SIZE, got RANK=", rank, " and WORLD_SIZE=", world_size);
  int local_rank = launch.local_rank >= 0 ? launch.local_rank : rank;
  static bool source_logged = false;  // once per process, on rank 0, when a scheduler said who is who
  if (rank == 0 && !source_logged && (launch.source == "slurm" || launch.source == "openmpi")) {
    source_logged = true;
    std::fprintf(stderr, "loom: init_process_group: %s\n", launch.describe().c_str());
  }

  auto store = connect_store_of_attempt(host, port, rank, launch.restart_count, timeout);  // Note [Restart generations]
  std::string prefix = "default_pg/" + std::to_string(g_groups_made++);
  verify_rendezvous(*store, prefix, rank, world_size, backend, timeout);  // Note [Why check the rendezvous]
  auto comm = make_communicator(backend, store, prefix, rank, world_size, timeout, host);
  World world{.store = store, .backend = backend, .rank = rank, .size = world_size, .timeout = timeout,
              .master_addr = host, .prefix = prefix};
  g_group = DefaultGroup{std::move(store), std::move(comm), prefix, local_rank, std::move(world)};
}

bool is_initialized() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_group.comm != nullptr;
}

void destroy_process_group() {
  DefaultGroup group;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    group = std::move(group_or_fail("destroy_process_group"));
    g_group = DefaultGroup{};
  }
  // Rank 0's process serves the store: it waits until everyone has checked out, so that
  // no rank still talking to the store finds it gone. A rank that crashed makes this
  // wait run out; that is reported, not thrown, since the job is ending anyway.
  const int rank = group.comm->rank(), size = group.comm->size();
  const auto wait_at_most = std::min(group.comm->timeout(), std::chrono::milliseconds(std::chrono::seconds(60)));
  group.comm.reset();
  try {
    group.store->set(group.prefix + "/exit/" + std::to_string(rank), "1");
    if (group.store->is_server()) {
      std::vector<std::string> keys;
      for (int r = 0; r < size; ++r) keys.push_back(group.prefix + "/exit/" + std::to_string(r));
      group.store->wait(keys, wait_at_most);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom: rank %d: destroy_process_group did not see every rank leave: %s\n", rank, e.what());
  }
}

std::shared_ptr<Communicator> default_group() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return group_or_fail("default_group").comm;
}

std::shared_ptr<TCPStore> default_store() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return group_or_fail("default_store").store;
}

std::shared_ptr<Communicator> new_group(const std::vector<int>& ranks, const std::string& name) {
  std::lock_guard<std::mutex> lock(g_mutex);  // the group count is the default group's
  return new_group(group_or_fail("new_group").world, ranks, name);
}

int get_rank() { return default_group()->rank(); }
int get_world_size() { return default_group()->size(); }

int get_local_rank() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return group_or_fail("get_local_rank").local_rank;
}

bool is_main_process() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_group.comm == nullptr || g_group.comm->rank() == 0;
}

void barrier() { default_group()->barrier()->wait(); }
void all_reduce(const Tensor& tensor, ReduceOp op) { default_group()->all_reduce(tensor, op)->wait(); }
void broadcast(const Tensor& tensor, int root) { default_group()->broadcast(tensor, root)->wait(); }

}  // namespace loom::distributed
