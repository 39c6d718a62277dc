// verify_rendezvous: the launch mistakes init_process_group catches before any
// communicator waits for a peer (Note [Why check the rendezvous]). Each rank is a thread
// with its own TCPStore client, as separate processes would have.
#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "parallel/comm/rendezvous.h"
#include "parallel/store/tcp_store.h"

using namespace loom::distributed;
using namespace std::chrono_literals;

namespace {

struct Launch {
  int rank;
  int world_size;
  std::string backend = "gloo";
};

// Runs verify_rendezvous for each launch in its own thread; returns each one's error ("" if none).
std::vector<std::string> rendezvous(const std::vector<Launch>& launches, std::chrono::milliseconds timeout = 5s) {
  auto server = std::make_shared<TCPStore>("127.0.0.1", 0, /*is_server=*/true, 10s);
  std::vector<std::string> errors(launches.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < launches.size(); ++i) {
    threads.emplace_back([&, i] {
      try {
        TCPStore store("127.0.0.1", server->port(), /*is_server=*/false, 10s);
        verify_rendezvous(store, "pg", launches[i].rank, launches[i].world_size, launches[i].backend, timeout);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("ranks that agree pass, in any arrival order") {
  for (const auto& errors : {rendezvous({{0, 3}, {1, 3}, {2, 3}}), rendezvous({{2, 3}, {1, 3}, {0, 3}}),
                             rendezvous({{0, 1}})}) {
    for (const auto& e : errors) CHECK(e == "");
  }
}

TEST_CASE("two processes with the same RANK: the second is told, rank 0 names the rank that never came") {
  auto errors = rendezvous({{0, 3}, {1, 3}, {1, 3}}, 1500ms);
  const bool first_won = errors[1].empty();
  const std::string& duplicate = first_won ? errors[2] : errors[1];
  CHECK(contains(duplicate, "2 processes started with RANK=1"));
  CHECK(contains(duplicate, "--node_rank"));
  CHECK(contains(errors[0], "1 never arrived (rank 2)"));
}

TEST_CASE("different WORLD_SIZEs: both sides say what each was started with") {
  auto errors = rendezvous({{0, 2}, {1, 3}});
  CHECK(contains(errors[1], "rank 1 was started with WORLD_SIZE=3 backend=gloo but rank 0 with WORLD_SIZE=2"));
  CHECK(contains(errors[0], "rank 0 was started with WORLD_SIZE=2 backend=gloo but rank 1 with WORLD_SIZE=3"));
  // A rank beyond rank 0's world is never waited for, but still learns the truth.
  errors = rendezvous({{0, 2}, {1, 2}, {2, 3}});
  CHECK(errors[0] == "");
  CHECK(errors[1] == "");
  CHECK(contains(errors[2], "rank 2 was started with WORLD_SIZE=3 backend=gloo but rank 0 with WORLD_SIZE=2"));
}

TEST_CASE("different backends are an error naming both") {
  auto errors = rendezvous({{0, 2, "gloo"}, {1, 2, "nccl"}});
  CHECK(contains(errors[1], "WORLD_SIZE=2 backend=nccl but rank 0 with WORLD_SIZE=2 backend=gloo"));
  CHECK(contains(errors[0], "but rank 1 with WORLD_SIZE=2 backend=nccl"));
}

TEST_CASE("ranks that never arrive: rank 0 times out naming them; a rank without rank 0 names rank 0") {
  auto start = std::chrono::steady_clock::now();
  auto errors = rendezvous({{0, 4}, {2, 4}}, 1s);
  CHECK(std::chrono::steady_clock::now() - start < 8s);
  CHECK(contains(errors[0], "rank 0 waited 1.000 s for all 4 ranks; 2 never arrived (ranks 1, 3)"));
  CHECK(errors[1] == "");  // rank 0 was there and agreed; its own timeout comes from the backend
  errors = rendezvous({{1, 2}}, 1s);
  CHECK(contains(errors[0], "rank 1 reached the store"));
  CHECK(contains(errors[0], "rank 0 did not register within 1.000 s"));
}
