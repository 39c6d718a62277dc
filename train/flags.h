// Flags: a small command-line parser that writes --help from what it was told.
//
//   Flags flags("train_cifar10", "Trains ResNet18 on CIFAR-10.");
//   int64_t& epochs = flags.add<int64_t>("epochs", 3, "passes over the training set");
//   flags.section("optimizer");                          // --help groups what follows
//   flags.bind("lr", config.lr, "learning rate");        // parses into the field; its value is the default
//   flags.parse(argc, argv);   // exits 0 after printing --help; loom::Error on bad input
//
// Accepts "--name value" and "--name=value"; booleans are switches ("--nesterov").
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace loom::training {

class Flags {
 public:
  Flags(std::string program, std::string description);

  template <typename T>
  T& add(const std::string& name, T default_value, const std::string& help);
  // A flag that parses straight into `target` (a config's field), whose current value is
  // the default --help shows. `target` must outlive parse().
  template <typename T>
  void bind(const std::string& name, T& target, const std::string& help);
  // The flags added after this are listed under `title` in --help.
  void section(const std::string& title);

  // The table itself, for programs that rewrite a command line (train/estimate_memory.cpp).
  struct Info {
    std::string section, name;
    bool is_switch = false;  // takes no value
  };
  std::vector<Info> list() const;

  void parse(int argc, char** argv);
  // Whether the user gave this flag (vs its default).
  bool given(const std::string& name) const;
  std::string help() const;

 private:
  struct Flag {
    std::string section, name, help, default_text, type;
    bool is_switch = false;
    bool given = false;
    std::function<void(const std::string&)> set;
  };
  Flag* find(const std::string& name);
  std::string program_, description_, section_;
  std::vector<std::unique_ptr<Flag>> flags_;
  std::vector<std::shared_ptr<void>> storage_;
};

}  // namespace loom::training
