// parallel/comm/launch_env.h: who is who when Slurm or Open MPI started the process
// (Note [Where rank and world size come from]) -- the pure parsing, on environments
// given as maps -- and the store's restart generation (Note [Restart generations]).
#include <doctest/doctest.h>

#include <chrono>
#include <thread>

#include "core/error.h"
#include "parallel/comm/launch_env.h"
#include "parallel/store/socket.h"  // defines: net::find_free_port

// GCC 12 warns (falsely, GCC bug 105329) about std::string assignments inlined into
// the map edits below.
#pragma GCC diagnostic ignored "-Wrestrict"

using namespace loom;
using namespace loom::distributed;
using namespace std::chrono_literals;
using Hosts = std::vector<std::string>;

TEST_CASE("expand_hostlist: Slurm's compressed host lists") {
  CHECK(expand_hostlist("node01") == Hosts{"node01"});
  CHECK(expand_hostlist("node[01-04,07]") == Hosts{"node01", "node02", "node03", "node04", "node07"});
  CHECK(expand_hostlist("a1,b[8-11],c") == Hosts{"a1", "b8", "b9", "b10", "b11", "c"});
  CHECK(expand_hostlist("node[098-101]") == Hosts{"node098", "node099", "node100", "node101"});  // padding kept
  CHECK(expand_hostlist("rack[1-2]-n[1,3]-ib") == Hosts{"rack1-n1-ib", "rack1-n3-ib", "rack2-n1-ib", "rack2-n3-ib"});
  CHECK(expand_hostlist("10.0.0.[5-6]") == Hosts{"10.0.0.5", "10.0.0.6"});
  // Only the first host is needed for MASTER_ADDR: a huge range is not expanded past it.
  CHECK(expand_hostlist("n[0-999999999999],m", 1) == Hosts{"n0"});
  CHECK(expand_hostlist("n[1-3]x[0-99999999]", 2) == Hosts{"n1x0", "n1x1"});
  for (const char* bad : {"node[01-04", "node01-04]", "node[]", "node[4-1]", "node[a-b]", "a,,b", "n[[1]]", "n[1-]",
                          ""}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(expand_hostlist(bad), doctest::Contains("Slurm host list"), Error);
  }
}

TEST_CASE("expand_tasks_per_node: '2(x3),1' and plain counts") {
  CHECK(expand_tasks_per_node("4") == std::vector<int>{4});
  CHECK(expand_tasks_per_node("2(x3),1") == std::vector<int>{2, 2, 2, 1});
  CHECK(expand_tasks_per_node("1,3(x2)") == std::vector<int>{1, 3, 3});
  for (const char* bad : {"", "2(x)", "2(3)", "x", "2(x3", "-1", "2,,1", "2(x0)"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(expand_tasks_per_node(bad), doctest::Contains("Slurm tasks per node"), Error);
  }
}

TEST_CASE("port_from_slurm_job_id: Lightning's 15000 + last four digits") {
  CHECK(port_from_slurm_job_id("1234567") == 15000 + 4567);
  CHECK(port_from_slurm_job_id("42") == 15042);
  CHECK(port_from_slurm_job_id("10000") == 15000);
  CHECK_THROWS_WITH_AS(port_from_slurm_job_id("12_3"), doctest::Contains("MASTER_PORT"), Error);
}

TEST_CASE("read_launch_env: Slurm") {
  Environment env = {{"SLURM_PROCID", "5"},       {"SLURM_NTASKS", "8"},
                     {"SLURM_LOCALID", "1"},      {"SLURM_NODEID", "2"},
                     {"SLURM_TASKS_PER_NODE", "2(x3),1"}, {"SLURM_JOB_NODELIST", "gpu[07-10]"},
                     {"SLURM_STEP_NODELIST", "gpu[08-10]"}, {"SLURM_JOB_ID", "991234"}};
  LaunchEnv e = read_launch_env(env);
  CHECK(e.source == "slurm");
  CHECK(e.rank == 5);
  CHECK(e.world_size == 8);
  CHECK(e.local_rank == 1);
  CHECK(e.local_world_size == 2);  // node 2 of 2(x3),1
  CHECK(e.master_addr == "gpu08");  // the step's first host wins over the job's
  CHECK(e.master_port == 16234);
  CHECK(e.restart_count == 0);
  CHECK(doctest::String(e.describe().c_str()) == doctest::Contains("Slurm"));

  env["SLURM_NTASKS_PER_NODE"] = "4";  // --ntasks-per-node: one number for every node
  env["MASTER_ADDR"] = "head";         // the user's own always win
  env["MASTER_PORT"] = "1234";
  env["LOOM_RESTART_COUNT"] = "2";
  e = read_launch_env(env);
  CHECK(e.local_world_size == 4);
  CHECK(e.master_addr == "head");
  CHECK(e.master_port == 1234);
  CHECK(e.restart_count == 2);

  env.erase("SLURM_NTASKS");  // half a source
  CHECK_THROWS_WITH_AS(read_launch_env(env), doctest::Contains("SLURM_NTASKS is not"), Error);
  // salloc's shell: SLURM_NTASKS but no task of a step; not a source.
  CHECK(read_launch_env({{"SLURM_NTASKS", "4"}}).source == "");
  CHECK_THROWS_WITH_AS(read_launch_env({{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}}),
                       doctest::Contains("rank 4 is not below the world size 4"), Error);
  CHECK_THROWS_WITH_AS(read_launch_env({{"SLURM_PROCID", "x"}, {"SLURM_NTASKS", "4"}}),
                       doctest::Contains("SLURM_PROCID: expected an integer"), Error);
}

TEST_CASE("read_launch_env: Open MPI, and mpirun inside a Slurm allocation") {
  Environment env = {{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                     {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                     {"MASTER_ADDR", "10.0.0.1"}};
  LaunchEnv e = read_launch_env(env);
  CHECK(e.source == "openmpi");
  CHECK(e.rank == 3);
  CHECK(e.world_size == 4);
  CHECK(e.local_rank == 1);
  CHECK(e.local_world_size == 2);
  CHECK(e.master_addr == "10.0.0.1");
  CHECK(e.master_port == 29500);
  // Without MASTER_ADDR Open MPI gives no host: init_process_group then names MASTER_ADDR.
  env.erase("MASTER_ADDR");
  CHECK(read_launch_env(env).master_addr.empty());

  // The allocation's Slurm variables agree on the size: Open MPI's describe this process.
  env["SLURM_PROCID"] = "0";
  env["SLURM_NTASKS"] = "4";
  env["SLURM_JOB_NODELIST"] = "n[1-2]";
  CHECK(read_launch_env(env).rank == 3);
  // They disagree: a conflict, not a guess.
  env["SLURM_NTASKS"] = "8";
  CHECK_THROWS_WITH_AS(read_launch_env(env), doctest::Contains("conflicting launchers"), Error);
  env.erase("OMPI_COMM_WORLD_SIZE");
  CHECK_THROWS_WITH_AS(read_launch_env(env), doctest::Contains("OMPI_COMM_WORLD_SIZE come together"), Error);
}

TEST_CASE("read_launch_env: RANK and WORLD_SIZE (loomrun, torchrun) win over a scheduler's") {
  // srun loomrun ...: Slurm's variables describe loomrun's task, RANK the worker.
  Environment env = {{"RANK", "6"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "2"}, {"MASTER_ADDR", "h"},
                     {"MASTER_PORT", "29400"}, {"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"},
                     {"TORCHELASTIC_RESTART_COUNT", "3"}};
  LaunchEnv e = read_launch_env(env);
  CHECK(e.source == "env");
  CHECK(e.rank == 6);
  CHECK(e.world_size == 8);
  CHECK(e.local_rank == 2);
  CHECK(e.master_port == 29400);
  CHECK(e.restart_count == 3);  // torchrun's name, when loomrun's is absent
  env["LOOM_RESTART_COUNT"] = "1";
  CHECK(read_launch_env(env).restart_count == 1);
  // Nothing at all: not an error here (init_process_group names what is missing).
  e = read_launch_env({});
  CHECK(e.source == "");
  CHECK(e.rank == -1);
  CHECK(e.master_port == 0);
  CHECK_THROWS_WITH_AS(read_launch_env({{"RANK", "0"}, {"MASTER_PORT", "70000"}}), doctest::Contains("MASTER_PORT"),
                       Error);
}

TEST_CASE("the store's restart generation: an old attempt's rank is refused, a new one's waits for its store") {
  const int port = net::find_free_port();
  auto old_store = connect_store_of_attempt("127.0.0.1", port, /*rank=*/0, /*restart_count=*/0, 5s);
  // Same attempt: joins.
  CHECK(connect_store_of_attempt("127.0.0.1", port, 1, 0, 5s) != nullptr);
  // A rank of attempt 1 reaches attempt 0's store: it retries until attempt 1's rank 0
  // serves the port.
  std::thread late_rank0([&] {
    std::this_thread::sleep_for(300ms);
    old_store.reset();  // the old rank 0 exits
    auto new_store = connect_store_of_attempt("127.0.0.1", port, 0, 1, 5s);
    std::this_thread::sleep_for(1s);  // serves long enough for the test below
  });
  auto joined = connect_store_of_attempt("127.0.0.1", port, 1, 1, 10s);
  CHECK(joined->get("launch/restart_count") == "1");
  // A rank left over from attempt 0 is refused with a message that says so.
  CHECK_THROWS_WITH_AS(connect_store_of_attempt("127.0.0.1", port, 1, 0, 5s),
                       doctest::Contains("left over from a failed attempt"), Error);
  joined.reset();
  late_rank0.join();
}
