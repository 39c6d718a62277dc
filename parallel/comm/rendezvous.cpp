#include "parallel/comm/rendezvous.h"

#include <vector>

#include "core/error.h"

namespace loom::distributed {

namespace {

std::string entry(int world_size, const std::string& backend) {
  return "WORLD_SIZE=" + std::to_string(world_size) + " backend=" + backend;
}

std::string seconds(std::chrono::milliseconds timeout) {
  return std::to_string(timeout.count() / 1000.0).substr(0, 5) + " s";
}

}  // namespace

// See Note [Why check the rendezvous] in rendezvous.h.
void verify_rendezvous(TCPStore& store, const std::string& prefix, int rank, int world_size,
                       const std::string& backend, std::chrono::milliseconds timeout) {
  const std::string keys = prefix + "/rendezvous/";
  const std::string mine = entry(world_size, backend);

  const int64_t claims = store.add(keys + "claim/" + std::to_string(rank), 1);
  LOOM_CHECK(claims == 1, "init_process_group: ", claims, " processes started with RANK=", rank,
             " (this one is number ", claims, "); every process of a job needs its own RANK in 0 ... WORLD_SIZE-1. "
             "Check the launch: with loomrun, give each node its own --node_rank");
  store.set(keys + "world/" + std::to_string(rank), mine);

  if (rank != 0) {
    const std::string key = keys + "world/0";
    try {
      store.wait({key}, timeout);
    } catch (const std::exception&) {
      LOOM_FAIL("init_process_group: rank ", rank, " reached the store at ", store.host(), ":", store.port(),
                " but rank 0 did not register within ", seconds(timeout), ". Is rank 0 running, and with the same "
                "MASTER_PORT?");
    }
    const std::string theirs = store.get(key);
    LOOM_CHECK(theirs == mine, "init_process_group: rank ", rank, " was started with ", mine, " but rank 0 with ",
               theirs, ". Every process of a job needs the same WORLD_SIZE and backend (with loomrun: the same "
               "--nnodes and --nproc_per_node on every node, and the same program flags)");
    return;
  }

  std::vector<std::string> others;
  for (int r = 1; r < world_size; ++r) others.push_back(keys + "world/" + std::to_string(r));
  try {
    store.wait(others, timeout);
  } catch (const std::exception&) {
    std::string missing;
    int count = 0;
    for (int r = 1; r < world_size; ++r) {
      if (store.check({keys + "world/" + std::to_string(r)})) continue;
      missing += (count++ ? ", " : "") + std::to_string(r);
    }
    LOOM_FAIL("init_process_group: rank 0 waited ", seconds(timeout), " for all ", world_size, " ranks; ", count,
              " never arrived (rank", count == 1 ? " " : "s ", missing, "). Did they start, with MASTER_ADDR=",
              store.host(), " and MASTER_PORT=", store.port(), "? A worker that crashed early says why in its "
              "own output");
  }
  for (int r = 1; r < world_size; ++r) {
    const std::string theirs = store.get(keys + "world/" + std::to_string(r));
    LOOM_CHECK(theirs == mine, "init_process_group: rank 0 was started with ", mine, " but rank ", r, " with ",
               theirs, ". Every process of a job needs the same WORLD_SIZE and backend (with loomrun: the same "
               "--nnodes and --nproc_per_node on every node, and the same program flags)");
  }
}

}  // namespace loom::distributed
