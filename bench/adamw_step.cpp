// adamw_step: loom's side of bench/adamw_error_torch.py, which compares one AdamW step of
// loom and of PyTorch (both float32) against the float64 truth.
//
//   build/bench/adamw_step --in /tmp/adamw/in.safetensors --out /tmp/adamw/loom.safetensors
//
// Reads "param" and "grad" (float32, any shape), and optionally "exp_avg", "exp_avg_sq" and
// "step" (a state to start from), takes one optim::AdamW step with the hyperparameters
// given as flags (PyTorch's defaults otherwise) and writes the new "param".
#include <cstdio>
#include <string>

#include "nn/optim/adamw.h"  // defines: AdamW
#include "nn/safetensors.h"  // defines: safetensors::load_file, save_file

using namespace loom;

int main(int argc, char** argv) {
  std::string in = "/tmp/adamw/in.safetensors", out = "/tmp/adamw/loom.safetensors";
  optim::AdamWOptions o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--in") in = value;
    else if (flag == "--out") out = value;
    else if (flag == "--lr") o.lr = std::stod(value);
    else if (flag == "--weight-decay") o.weight_decay = std::stod(value);
    else if (flag == "--eps") o.eps = std::stod(value);
    else {
      std::fprintf(stderr, "adamw_step: unknown flag %s (expected --in --out --lr --weight-decay --eps)\n",
                   flag.c_str());
      return 2;
    }
  }
  OrderedDict<Tensor> data = safetensors::load_file(in);
  Tensor p = data["param"].clone().requires_grad_(true);
  optim::AdamW opt({p}, o);
  if (data.contains("step")) {
    OrderedDict<Tensor> state = opt.state_dict();
    state.insert("state.0.step", data["step"].reshape({}));
    state.insert("state.0.exp_avg", data["exp_avg"]);
    state.insert("state.0.exp_avg_sq", data["exp_avg_sq"]);
    opt.load_state_dict(state);
  }
  p.set_grad(data["grad"]);
  opt.step();
  OrderedDict<Tensor> result;
  result.insert("param", p.detach());
  safetensors::save_file(result, out);
  return 0;
}
