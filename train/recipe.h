// Recipes: a run's settings in a TOML file, as torchtitan's job configs are, whose tables
// group train_cifar10's flags and whose keys are the flags' names without the "--":
//
//   # recipes/resnet18_94.toml
//   [optimizer]
//   lr = 0.4
//   nesterov = true
//
//   train_cifar10 --recipe resnet18_94                  # recipes/resnet18_94.toml
//   train_cifar10 --recipe resnet18_94 --epochs 1      # a flag overrides the recipe's key
//   train_cifar10 --recipe my_run.toml                  # any file
//
// Note [Recipes are defaults]
// A recipe sets the flags' values before the command line is read, so every key is a
// default the command line can override, and the flag table's rules (train/flags.h) judge
// the result whichever set it: a recipe holds nothing a command line could not say. A key
// must sit in its flag's table ([optimizer] lr, not [data] lr), so that a recipe reads as
// --help lists the flags, and an unknown key or a value of the wrong kind is an error
// naming the file, the table and the key. The effective settings -- recipe, then flags --
// are printed at the start of a run and saved as config.toml beside its checkpoints
// (effective_config_toml, train/command_line.h), itself a recipe that trains the same run.
#pragma once

#include <string>

#include "train/flags.h"  // defines: Flags

namespace loom::training {

// The file `name` names: itself when it is a path (holds a '/' or ends in ".toml"), else
// recipes/<name>.toml in the current folder or the loom source tree. A loom::Error listing
// the recipes there when there is none.
std::string find_recipe(const std::string& name);

// Sets `flags` from the TOML file at `path` (Note [Recipes are defaults]).
void apply_recipe(Flags& flags, const std::string& path);

// The value of --recipe in a command line ("--recipe X" or "--recipe=X"), or "".
std::string recipe_argument(int argc, char** argv);

}  // namespace loom::training
