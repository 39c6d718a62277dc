// Recipes (train/recipe.h): a TOML file's keys set train_cifar10's flags and the command line
// overrides them (Note [Recipes are defaults]); every mistake in a file is an error naming
// the file, the table and the key; the settings a run records (effective_config_toml) read
// back as the same run; the recipes loom ships parse, pass the flag table's rules, and
// train (resnet18_94: 2 steps).
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "train/command_line.h"  // defines: parse_train_flags, check_train_config, effective_config_toml
#include "train/recipe.h"        // defines: find_recipe
#include "temp_dir.h"            // defines: TempDir

using namespace loom;
using namespace loom::training;
using loom::testing::TempDir;

namespace {

TrainConfig parse(std::vector<std::string> args) {
  args.insert(args.begin(), "train_cifar10");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return parse_train_flags(static_cast<int>(argv.size()), argv.data());
}

std::string write(const TempDir& dir, const std::string& name, const std::string& text) {
  const std::string path = (dir.path / name).string();
  std::ofstream(path) << text;
  return path;
}

}  // namespace

TEST_CASE("a recipe's keys set the flags, and the command line overrides them") {
  TempDir dir("loom_recipe");
  const std::string recipe = write(dir, "r.toml",
                                   "[data]\nbatch-size = 64\nflip = \"alternating\"\n"
                                   "[optimizer]\nlr = 0.25\nnesterov = true\nepochs = 7\n"
                                   "[model]\nmodel = \"tiny\"\nseed = 5\n");
  TrainConfig c = parse({"--recipe", recipe});
  CHECK(c.data.batch_size == 64);
  CHECK(c.data.flip == "alternating");
  CHECK(c.optim.lr == 0.25);
  CHECK(c.optim.nesterov);
  CHECK(c.training.epochs == 7);
  CHECK(c.model.name == "tiny");
  CHECK(c.training.seed == 5);
  CHECK(c.recipe == recipe);
  // Flags beside it win, before or after --recipe on the line.
  TrainConfig o = parse({"--epochs", "2", "--recipe=" + recipe, "--lr", "0.1"});
  CHECK(o.training.epochs == 2);
  CHECK(o.optim.lr == 0.1);
  CHECK(o.data.batch_size == 64);
  // What the run records reads back as the same settings.
  const std::string effective = write(dir, "effective.toml", o.effective_toml);
  TrainConfig again = parse({"--recipe", effective});
  CHECK(again.effective_toml == o.effective_toml);
  CHECK(effective_config_toml(again) == o.effective_toml);
  // A config filled in code records its fields the same way.
  TrainConfig coded = again;
  coded.effective_toml.clear();
  CHECK(effective_config_toml(coded) == o.effective_toml);
}

TEST_CASE("every mistake in a recipe is an error naming the file, the table and the key") {
  TempDir dir("loom_recipe_bad");
  struct Bad {
    const char* text;
    const char* message;
  };
  const Bad cases[] = {
      {"[data]\nlearning-rate = 0.1\n", "[data] learning-rate: not a flag of train_cifar10"},
      {"[data]\nlr = 0.1\n", "lr belongs in the table [optimizer], found in [data]"},
      {"lr = 0.1\n", "lr is a top-level key"},
      {"[optimizer]\nepochs = \"ten\"\n", "[optimizer] epochs = ten: --epochs: expected an integer, got 'ten'"},
      {"[optimizer]\nlr = -1.0\n", "--lr: expected 0 or more, got -1"},
      {"[optimizer]\nlr = [0.1, 0.2]\n", "expected a string, a number or true/false"},
      {"[recipe]\nrecipe = \"other\"\n", "a recipe cannot name another recipe"},
      {"[optimizer\nlr = 0.1\n", "not a TOML file"},
  };
  for (const Bad& bad : cases) {
    CAPTURE(bad.text);
    const std::string path = write(dir, "bad.toml", bad.text);
    try {
      TrainConfig c = parse({"--recipe", path});
      check_train_config(c);
      FAIL("expected an error");
    } catch (const Error& e) {
      const std::string message = e.what();
      CHECK_MESSAGE(message.find(bad.message) != std::string::npos, message);
    }
  }
  CHECK_THROWS_WITH_AS(parse({"--recipe", "no_such_recipe"}), doctest::Contains("the recipes are:"), Error);
  CHECK_THROWS_WITH_AS(parse({"--recipe", (dir.path / "missing.toml").string()}), doctest::Contains("no such file"),
                       Error);
}

TEST_CASE("the recipes loom ships parse, pass the table's rules, and resnet18_94 trains 2 steps") {
  for (const char* name : {"resnet18_94", "resnet18_run_sh"}) {
    CAPTURE(name);
    TrainConfig c = parse({"--recipe", name});
    CHECK_NOTHROW(check_train_config(c));
  }
  TrainConfig c = parse({"--recipe", "resnet18_94"});
  CHECK(c.model.name == "resnet18");
  CHECK(c.training.epochs == 15);
  CHECK(c.optim.lookahead_every == 5);
  CHECK(c.data.padding_mode == "reflect");
  // Two steps of the recipe itself (ResNet18, Lookahead, the flips and crops), on synthetic images.
  TrainConfig two = parse({"--recipe", "resnet18_94", "--synthetic", "--max-steps", "2", "--batch-size", "8",
                           "--eval-limit", "8", "--workers", "0", "--threads", "2", "--quiet"});
  TrainResult r = train_cifar10(two);
  CHECK(r.steps == 2);
  CHECK(std::isfinite(r.train_loss));
}
