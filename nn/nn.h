// loom's nn in one include: modules, layers, losses, init, ResNet, checkpoints, optim.
//
// Folder map (one concept per file):
//   module.h         Module, Parameter, Cloneable (registries, to(), train(), clone())
//   state_dict.cpp   Module::state_dict / load_state_dict
//   container.h      Sequential
//   conv.h           Conv2d              batchnorm.h   BatchNorm2d
//   linear.h         Linear, Flatten, Identity
//   pooling.h        MaxPool2d, AvgPool2d, AdaptiveAvgPool2d
//   activation.h     ReLU, GELU, Dropout loss.h        CrossEntropyLoss
//   normalization.h  LayerNorm           embedding.h   Embedding
//   multihead_attention.h  MultiheadAttention (q/k/v projections as three Linears)
//   transformer.h    TransformerEncoderLayer
//   vision_transformer.h  VisionTransformer, vit_tiny, vit_small (CIFAR, 4x4 patches)
//   init.h           nn::init (kaiming_uniform_, ...)
//   resnet.h         ResNet, resnet18/34/50/101/152, wide_resnet50_2/101_2, resnet_tiny (tests)
//   resnet_blocks.h  BasicBlock, Bottleneck
//   models.h         make_model(name): the models by name (train_cifar10 --model)
//   json.h           the JSON subset safetensors needs
//   safetensors.h    save_file / load_file, nn::save / nn::load
//   checkpoint.h     checkpoint(fn, x), apply_activation_checkpointing: activation
//                    checkpointing (torch.utils.checkpoint)
//   model_state.h    model_state_bytes: parameters + gradients + optimizer state, resident
//   optim/optimizer.h     Optimizer, ParamGroup
//   optim/grad_scaler.h   GradScaler: dynamic loss scaling for float16 autocast
//   optim/sgd.h           SGD and its fused update kernel
//   optim/adamw.h         AdamW (decoupled weight decay), param_groups_weight_decay
//   optim/clip_grad.h     nn::utils::clip_grad_norm_
//   optim/lr_scheduler.h  StepLR, MultiStepLR, CosineAnnealingLR, LinearLR, SequentialLR,
//                         OneCycleLR, scale_lr_linear
#pragma once

#include "autograd/grad_mode.h"  // NoGradGuard, for evaluation loops
#include "autograd/ops.h"        // the differentiable functions layers are built from
#include "nn/activation.h"
#include "nn/batchnorm.h"
#include "nn/checkpoint.h"
#include "nn/container.h"
#include "nn/conv.h"
#include "nn/embedding.h"
#include "nn/init.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/model_state.h"
#include "nn/models.h"
#include "nn/module.h"
#include "nn/multihead_attention.h"
#include "nn/normalization.h"
#include "nn/optim/adamw.h"
#include "nn/optim/clip_grad.h"
#include "nn/optim/grad_scaler.h"
#include "nn/optim/lr_scheduler.h"
#include "nn/optim/optimizer.h"
#include "nn/optim/sgd.h"
#include "nn/pooling.h"
#include "nn/resnet.h"
#include "nn/resnet_blocks.h"
#include "nn/safetensors.h"
#include "nn/transformer.h"
#include "nn/vision_transformer.h"
