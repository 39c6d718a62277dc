// train_cifar10's command line: one table of flags, each bound to the TrainConfig field it
// sets (its default is the field's), grouped for --help; and the program's main.
//
//   int main(int argc, char** argv) { return loom::training::train_main(argc, argv); }
//
//   TrainConfig config = parse_train_flags(argc, argv);   // loom::Error on bad input
//
// Each rule about the flags' values is part of the table, beside its flag (Note [One
// table, one place for each rule], command_line.cpp); check_train_config runs them.
#pragma once

#include <string>

#include "train/trainer.h"  // defines: TrainConfig

namespace loom::training {

// The TrainConfig the flags describe; exits 0 after printing --help.
TrainConfig parse_train_flags(int argc, char** argv);

// Every rule of the table on `config`, however it was filled: a loom::Error naming the
// flag (or flags) and what was expected. train_cifar10 calls it first.
void check_train_config(const TrainConfig& config);

// The run's settings as a recipe file (train/recipe.h): the flags' values after --recipe and
// the command line (TrainConfig::effective_toml), or for a config filled in code, its fields.
std::string effective_config_toml(const TrainConfig& config);

// parse_train_flags and check_train_config, then train_cifar10; any exception is printed
// as one "train_cifar10: error: ..." line and returns 1 (a command-line error once per
// launch: Note [One error, once], flags.cpp). A program that registers its own models
// (register_model_spec, train/model_spec.h) first is a trainer for them too.
int train_main(int argc, char** argv);

}  // namespace loom::training
