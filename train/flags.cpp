#include "train/flags.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "parallel/comm/launch_env.h"  // defines: read_launch_env (which process of a launch this is)

namespace loom::training {
namespace {

template <typename T>
std::string type_name();
template <> std::string type_name<int64_t>() { return "N"; }
template <> std::string type_name<double>() { return "X"; }
template <> std::string type_name<std::string>() { return "S"; }
template <> std::string type_name<bool>() { return ""; }

template <typename T>
T parse_value(const std::string& flag, const std::string& text) {
  if constexpr (std::is_same_v<T, std::string>) {
    return text;
  } else {
    std::istringstream in(text);
    T value{};
    in >> value;
    LOOM_CHECK(in && in.peek() == EOF, "--", flag, ": expected ",
               std::is_same_v<T, int64_t> ? "an integer" : "a number", ", got '", text, "'");
    return value;
  }
}

template <typename T>
std::string to_text(const T& value) {
  if constexpr (std::is_same_v<T, std::string>) {
    return value.empty() ? "" : value;
  } else if constexpr (std::is_same_v<T, bool>) {
    return value ? "on" : "off";
  } else if constexpr (std::is_same_v<T, double>) {
    char text[64];  // the shortest text that reads back as the same double (0.1, 5e-04)
    const auto end = std::to_chars(text, text + sizeof(text), value).ptr;
    return std::string(text, end);
  } else {
    std::ostringstream out;
    out << value;
    return out.str();
  }
}

}  // namespace

Flags::Flags(std::string program, std::string description)
    : program_(std::move(program)), description_(std::move(description)) {}

template <typename T>
T& Flags::add(const std::string& name, T default_value, const std::string& help) {
  auto value = std::make_shared<T>(std::move(default_value));
  storage_.push_back(value);
  bind(name, *value, help);
  return *value;
}

template <typename T>
void Flags::bind(const std::string& name, T& target, const std::string& help) {
  LOOM_CHECK(find(name) == nullptr, program_, ": --", name, " is defined twice");
  auto flag = std::make_unique<Flag>();
  flag->section = section_;
  flag->section_id = section_id_;
  flag->name = name;
  flag->help = help;
  flag->default_text = to_text(target);
  flag->type = type_name<T>();
  flag->is_switch = std::is_same_v<T, bool>;
  T* field = &target;
  flag->set = [field, name](const std::string& text) {
    if constexpr (std::is_same_v<T, bool>) {
      *field = text.empty() || text == "1" || text == "true" || text == "on";
    } else {
      *field = parse_value<T>(name, text);
    }
  };
  flag->value_text = [field] { return to_text(*field); };
  if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, double>)
    flag->number = [field] { return static_cast<double>(*field); };
  flags_.push_back(std::move(flag));
}

void Flags::section(const std::string& title, const std::string& id) {
  section_ = title;
  section_id_ = id.empty() ? title : id;
}

void Flags::set_from_recipe(const std::string& source, const std::string& section, const std::string& name,
                            const std::string& value) {
  Flag* flag = find(name);
  LOOM_CHECK(flag, source, ": [", section, "] ", name, ": not a flag of ", program_, " (a recipe's keys are its "
             "flags without the leading --; see --help)");
  LOOM_CHECK(flag->section_id == section, source, ": ", name, " belongs in the table [", flag->section_id,
             "], found in [", section, "]");
  try {
    flag->set(value);
  } catch (const std::exception& e) {
    LOOM_FAIL(source, ": [", section, "] ", name, " = ", value, ": ", e.what());
  }
}

std::string Flags::to_toml(const std::vector<std::string>& skip) const {
  std::ostringstream out;
  std::string section = "-";
  for (const auto& flag : flags_) {
    if (std::find(skip.begin(), skip.end(), flag->name) != skip.end()) continue;
    if (flag->section_id != section) {
      section = flag->section_id;
      out << (out.tellp() > 0 ? "\n" : "") << "[" << section << "]\n";
    }
    const std::string value = flag->value_text();
    out << flag->name << " = ";
    if (flag->is_switch) {
      out << (value == "on" ? "true" : "false");
    } else if (flag->number) {
      out << value;
    } else {  // a TOML basic string: quotes and backslashes escaped
      out << '"';
      for (char c : value) out << (c == '"' || c == '\\' ? "\\" : "") << c;
      out << '"';
    }
    out << "\n";
  }
  return out.str();
}

void Flags::one_of(std::vector<std::string> choices) {
  LOOM_CHECK(!flags_.empty() && !choices.empty(), program_, ": one_of needs a flag bound before it and choices");
  const Flag& flag = *flags_.back();
  std::string listed;  // "a, b or c"
  for (size_t i = 0; i < choices.size(); ++i)
    listed += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + choices[i];
  rules_.push_back([name = flag.name, value = flag.value_text, choices = std::move(choices), listed] {
    const std::string v = value();
    for (const std::string& choice : choices)
      if (v == choice) return;
    LOOM_FAIL("--", name, ": expected ", listed, ", got '", v, "'");
  });
}

void Flags::add_range(double min, double max, bool exclusive, std::string expected) {
  LOOM_CHECK(!flags_.empty() && flags_.back()->number, program_, ": a range needs a number flag bound before it");
  const Flag& flag = *flags_.back();
  rules_.push_back([name = flag.name, number = flag.number, text = flag.value_text, min, max, exclusive,
                    expected = std::move(expected)] {
    const double v = number();
    LOOM_CHECK((exclusive ? v > min : v >= min) && v <= max, "--", name, ": expected ", expected, ", got ", text());
  });
}

void Flags::at_least(double min, std::string expected) {
  add_range(min, std::numeric_limits<double>::infinity(), false, std::move(expected));
}
void Flags::in_range(double min, double max, std::string expected) { add_range(min, max, false, std::move(expected)); }
void Flags::above(double bound, std::string expected) {
  add_range(bound, std::numeric_limits<double>::infinity(), true, std::move(expected));
}

void Flags::rule(std::function<void()> check) { rules_.push_back(std::move(check)); }

void Flags::check() const {
  for (const auto& rule : rules_) rule();
}

template int64_t& Flags::add<int64_t>(const std::string&, int64_t, const std::string&);
template double& Flags::add<double>(const std::string&, double, const std::string&);
template std::string& Flags::add<std::string>(const std::string&, std::string, const std::string&);
template bool& Flags::add<bool>(const std::string&, bool, const std::string&);
template void Flags::bind<int64_t>(const std::string&, int64_t&, const std::string&);
template void Flags::bind<double>(const std::string&, double&, const std::string&);
template void Flags::bind<std::string>(const std::string&, std::string&, const std::string&);
template void Flags::bind<bool>(const std::string&, bool&, const std::string&);

Flags::Flag* Flags::find(const std::string& name) {
  for (auto& flag : flags_)
    if (flag->name == name) return flag.get();
  return nullptr;
}

bool Flags::given(const std::string& name) const {
  for (const auto& flag : flags_)
    if (flag->name == name) return flag->given;
  return false;
}

void Flags::parse(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(help().c_str(), stdout);
      std::exit(0);
    }
    LOOM_CHECK(arg.rfind("--", 0) == 0, program_, ": unexpected argument '", arg, "'; flags start with --. See --help");
    std::string name = arg.substr(2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    Flag* flag = find(name);
    LOOM_CHECK(flag, program_, ": unknown flag --", name, ". See --help for the list");
    if (!flag->is_switch && !has_value) {
      LOOM_CHECK(i + 1 < argc, program_, ": --", name, " needs a value (", flag->type, ")");
      value = argv[++i];
    }
    flag->set(value);
    flag->given = true;
  }
}

std::string Flags::help() const {
  std::ostringstream out;
  out << "usage: " << program_ << " [flags]\n\n" << description_ << "\n";
  std::string section = "-";  // none printed yet
  for (const auto& flag : flags_) {
    if (flag->section != section) {  // flags without a section are listed under "flags"
      section = flag->section;
      out << "\n" << (section.empty() ? "flags" : section) << ":\n";
    }
    std::string left = "  --" + flag->name + (flag->type.empty() ? "" : " " + flag->type);
    out << left << std::string(left.size() < 28 ? 28 - left.size() : 1, ' ') << flag->help;
    if (!flag->is_switch && !flag->default_text.empty()) out << " (default: " << flag->default_text << ")";
    out << "\n";
  }
  return out.str();
}

// Note [One error, once]
// Every process of a launch reads the same command line, so a bad flag stops them all
// with the same error; printed by each, a run of 8 processes shows it 8 times, between
// loomrun's own lines. As torchrun's error summary names one root cause, the first
// process of each launcher (LOCAL_RANK 0) prints it, and the others one line pointing to
// it. Once per launcher rather than per job: each node's launcher has its own console,
// and a path flag is checked against the node's own file system. Only the command line's
// errors are said this way; an error met while training can be one rank's own, and every
// rank says its own.
// The others then wait a while before they exit: a launcher stops the rest of a job at
// its first failure (loomrun, torchrun and mpirun alike), and were that one of them, local
// rank 0 could be stopped before it had said why, and the summary would name a rank whose
// output only points elsewhere. So local rank 0 fails first, and the launcher stops them.
int report_flag_error(const std::string& program, const std::exception& error) {
  distributed::LaunchEnv launch;
  try {
    launch = distributed::read_launch_env(distributed::process_environment());
  } catch (const std::exception&) {  // a malformed launch environment: say the error here
  }
  if (launch.world_size > 1 && launch.local_rank > 0) {
    std::fprintf(stderr, "%s: rank %d: stopped by the command-line error that local rank 0 printed\n",
                 program.c_str(), launch.rank);
    std::fflush(stderr);
    std::this_thread::sleep_for(std::chrono::seconds(10));  // until the launcher stops this process
  } else {
    std::fprintf(stderr, "%s: error: %s\n", program.c_str(), error.what());
  }
  return 1;
}

}  // namespace loom::training
