// dcp_convert: a sharded checkpoint as one safetensors file, and a file as a sharded set
// (PyTorch's python -m torch.distributed.checkpoint.format_utils dcp_to_torch_save /
// torch_save_to_dcp).
//
//   dcp_convert to-file CKPT OUT.safetensors [--with-optimizer]
//       CKPT: a step directory, or a --checkpoint-dir (its newest complete step). OUT: the
//       model's tensors whole under the single-process names, as train_cifar10 --save
//       writes them (torch: safetensors.torch.load_file); --with-optimizer adds the
//       optimizer state by parameter name ("optim.<name>.<state>").
//   dcp_convert to-sharded IN.safetensors STEP_DIR
//       IN's tensors as a complete one-rank set, which any layout's load plan reads
//       (parallel/checkpoint/load_plan.h).
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>

#include "nn/safetensors.h"
#include "parallel/checkpoint/convert.h"
#include "parallel/distributed_checkpoint.h"
#include "train/path_flags.h"  // defines: check_input_file, check_output_file, check_output_folder

namespace ckpt = loom::distributed::checkpoint;

namespace {

int usage(const std::string& why) {
  std::fprintf(stderr, "dcp_convert: error: %s\nusage: dcp_convert to-file CKPT OUT.safetensors [--with-optimizer]\n"
               "       dcp_convert to-sharded IN.safetensors STEP_DIR\n", why.c_str());
  return 1;
}

// A step directory as given, or a checkpoint directory's newest complete step.
std::string step_dir_of(const std::string& path) {
  if (ckpt::why_incomplete(path).empty()) return path;
  const ckpt::Latest latest = ckpt::find_latest_complete(path);
  if (latest.step_dir.empty()) throw std::runtime_error(path + " is neither a complete step directory nor a "
                                                        "checkpoint directory holding one");
  return latest.step_dir;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string command = argc > 1 ? argv[1] : "";
    if (command == "to-file") {
      if (argc < 4 || argc > 5) return usage("to-file takes CKPT, OUT and optionally --with-optimizer");
      const bool with_optimizer = argc == 5 && std::string(argv[4]) == "--with-optimizer";
      if (argc == 5 && !with_optimizer) return usage(std::string("unknown flag ") + argv[4]);
      loom::training::check_output_file("OUT", argv[3]);
      const std::string step_dir = step_dir_of(argv[2]);
      const ckpt::CheckpointIndex index = ckpt::read_checkpoint_index(step_dir);
      const auto tensors = ckpt::consolidate(index, with_optimizer);
      loom::safetensors::save_file(tensors, argv[3], {{"format", "pt"}});
      std::printf("wrote %zu tensors of %s (%zu files) to %s\n", tensors.size(), step_dir.c_str(),
                  index.files.size(), argv[3]);
      return 0;
    }
    if (command == "to-sharded") {
      if (argc != 4) return usage("to-sharded takes IN and STEP_DIR");
      loom::training::check_input_file("IN", argv[2]);
      loom::training::check_output_folder("STEP_DIR", argv[3]);
      const auto tensors = loom::safetensors::load_file(argv[2]);
      ckpt::write_one_rank_set(tensors, argv[3]);
      std::printf("wrote %zu tensors of %s as a one-rank sharded set at %s\n", tensors.size(), argv[2], argv[3]);
      return 0;
    }
    return usage(command.empty() ? "no command" : "unknown command '" + command + "'");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dcp_convert: error: %s\n", e.what());
    return 1;
  }
}
