// train_cifar10: trains a model on CIFAR-10 in any parallel mode — loom's main job.
//
//   build/examples/train_cifar10 --epochs 1
//   build/examples/train_cifar10 --synthetic --max-steps 50     # throughput, no I/O
//   build/examples/train_cifar10 --checkpoint-dir ckpt --resume # continue exactly
//   build/parallel/loomrun --nproc_per_node 2 build/examples/train_cifar10 --mode ddp [--sync-bn]
//                                                                # one process per device
//   build/examples/train_cifar10 --mode dp --dp-devices 2 --threads 2  # one process, cpu:0 + cpu:1
//   build/examples/train_cifar10 --mode mp --mp-devices 2              # ResNet cut in 2 stages
//   build/examples/train_cifar10 --mode pipeline --microbatches 4 --pipeline-schedule 1f1b --threads 2
//
// The flags are train/command_line.cpp's table (--help lists them by section); the loop is
// train/trainer.cpp.
#include "train/command_line.h"  // defines: train_main

int main(int argc, char** argv) { return loom::training::train_main(argc, argv); }
