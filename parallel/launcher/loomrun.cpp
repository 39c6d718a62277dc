// loomrun: the launcher of multi-process loom jobs, like torchrun.
//
//   loomrun --nproc_per_node 2 ./build/examples/train_cifar10 --ddp
//
// It parses the options (options.h), picks the store's port for --standalone, then
// starts and supervises the workers (supervisor.h, Note [How loomrun stops a job]).
// It does not link libloom: a launcher only needs processes, pipes and signals.
#include <cstdio>
#include <exception>

#include "parallel/launcher/options.h"      // defines: parse_launch_options, launch_usage
#include "parallel/launcher/supervisor.h"   // defines: run_workers
#include "parallel/store/socket.h"          // defines: net::find_free_port

int main(int argc, char** argv) {
  using namespace loom::launcher;
  try {
    LaunchOptions options = parse_launch_options(argc, argv);
    if (options.help) {
      std::fputs(launch_usage(), stdout);
      return 0;
    }
    if (options.standalone) {
      options.master_addr = "127.0.0.1";
      options.master_port = loom::distributed::net::find_free_port();
    }
    return run_workers(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
