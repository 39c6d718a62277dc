// Flags: a small command-line parser that writes --help from what it was told.
//
//   Flags flags("train_cifar10", "Trains ResNet18 on CIFAR-10.");
//   int64_t& epochs = flags.add<int64_t>("epochs", 3, "passes over the training set");
//   flags.section("optimizer");                          // --help groups what follows
//   flags.bind("lr", config.optim.lr, "learning rate");  // parses into the field; its value is the default
//   flags.parse(argc, argv);   // exits 0 after printing --help; loom::Error on bad input
//
//   flags.one_of({"sgd", "adamw"});                      // rules on the flag bound last,
//   flags.at_least(1, "at least 1");                     // checked by check()
//   flags.in_range(0, 1, "0 to 1");                      // (numbers: integers and reals)
//   flags.rule([&] { LOOM_CHECK(...); });                // a rule between flags
//
// Accepts "--name value" and "--name=value"; booleans are switches ("--nesterov").
// The rules are the table's, not parse()'s: check() runs them on whatever the bound fields
// hold, parsed or set in code, so a program's config and a command line are held to the
// same rules in one place. Every number flag has its range in the table: a value out of
// it is one error naming the flag, never a run that reads -5 as "no limit".
//
//   catch (const std::exception& e) { return report_flag_error("train_cifar10", e); }
//
// says a command-line error once per launch (Note [One error, once], flags.cpp).
#pragma once

#include <cstdint>
#include <exception>
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
  // The flags added after this are listed under `title` in --help, and under the table
  // [id] in a recipe file (train/recipe.h); id defaults to the title.
  void section(const std::string& title, const std::string& id = "");

  // Rules on the flag bound last: "--name: expected a, b or c, got 'x'" unless its value is
  // one of `choices`; "--name: expected <expected>, got N" unless it is at least `min`, in
  // [min, max], or above `bound` (a number flag: integer or real; NaN is in no range).
  void one_of(std::vector<std::string> choices);
  void at_least(double min, std::string expected);
  void in_range(double min, double max, std::string expected);
  void above(double bound, std::string expected);
  // A rule of its own (between flags): a loom::Error naming them when broken.
  void rule(std::function<void()> check);
  // Every rule, in the table's order.
  void check() const;

  void parse(int argc, char** argv);
  // Sets flag `name` of table [section] to `value` (as typed after --name) from a recipe
  // file (`source` names it in errors): as a default the command line can still override.
  void set_from_recipe(const std::string& source, const std::string& section, const std::string& name,
                       const std::string& value);
  // Whether the user gave this flag (vs its default).
  bool given(const std::string& name) const;
  std::string help() const;
  // Every flag's current value as a recipe file would set it: "[id]" tables of
  // "name = value" lines, in the table's order; flags listed in `skip` left out.
  std::string to_toml(const std::vector<std::string>& skip = {}) const;

 private:
  struct Flag {
    std::string section, section_id, name, help, default_text, type;
    bool is_switch = false;
    bool given = false;
    std::function<void(const std::string&)> set;
    std::function<std::string()> value_text;  // the bound field's value, as text
    std::function<double()> number;           // a number flag's value; null for the others
  };
  Flag* find(const std::string& name);
  // The rule "min <= value <= max" (min < value when `exclusive`) on the flag bound last.
  void add_range(double min, double max, bool exclusive, std::string expected);
  std::string program_, description_, section_, section_id_;
  std::vector<std::unique_ptr<Flag>> flags_;
  std::vector<std::shared_ptr<void>> storage_;
  std::vector<std::function<void()>> rules_;
};

// A command-line error (parsing, the table's rules, the paths) said once per launch: in
// the first process of a launcher (LOCAL_RANK 0, or a process started alone) as
// "<program>: error: <what>", in its other processes as one line pointing to it (Note
// [One error, once], flags.cpp). Returns 1, the exit status.
int report_flag_error(const std::string& program, const std::exception& error);

}  // namespace loom::training
