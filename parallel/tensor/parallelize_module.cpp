#include "parallel/tensor/parallelize_module.h"

#include <map>
#include <sstream>  // defines: std::ostringstream (the modules an unmatched pattern could have named)

#include "autograd/grad_mode.h"  // defines: NoGradGuard
#include "core/error.h"          // defines: LOOM_CHECK, LOOM_FAIL

namespace loom::distributed {
namespace {

std::vector<std::string> split_names(const std::string& dotted) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (;;) {
    const size_t dot = dotted.find('.', start);
    parts.push_back(dotted.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) return parts;
    start = dot + 1;
  }
}

// '*' matches any run of characters, '?' one character; the rest themselves.
bool glob(const char* pattern, const char* text) {
  if (*pattern == '\0') return *text == '\0';
  if (*pattern == '*') return glob(pattern + 1, text) || (*text != '\0' && glob(pattern, text + 1));
  if (*text == '\0') return false;
  return (*pattern == '?' || *pattern == *text) && glob(pattern + 1, text + 1);
}

// See Note [One model on every tp rank].
void broadcast_from_rank0(nn::Module& module, Communicator& group) {
  NoGradGuard no_grad;
  for (const auto& tensors : {module.parameters(), module.buffers()})
    for (const Tensor& t : tensors) {
      LOOM_CHECK(t.is_contiguous(), "parallelize_module: a parameter or buffer of shape ", t.shape(),
                 " is not contiguous and cannot be broadcast in place");
      group.broadcast(t, 0)->wait();
    }
}

// "conv1, bn1, layer1, layer1.0, layer1.0.conv1, ..." : what a pattern could have named.
std::string module_names(nn::Module& module) {
  std::ostringstream out;
  int shown = 0;
  for (const auto& [name, child] : module.named_modules()) {
    if (name.empty()) continue;
    if (shown == 12) {
      out << ", ...";
      break;
    }
    out << (shown++ ? ", " : "") << name;
  }
  return out.str();
}

}  // namespace

bool matches_module_pattern(const std::string& pattern, const std::string& name) {
  const std::vector<std::string> want = split_names(pattern), have = split_names(name);
  if (want.size() != have.size()) return false;
  for (size_t i = 0; i < want.size(); ++i)
    if (!glob(want[i].c_str(), have[i].c_str())) return false;
  return true;
}

StatePlacements parallelize_module(nn::Module& module, const std::shared_ptr<Communicator>& group,
                                   const ParallelizePlan& plan) {
  LOOM_CHECK(group != nullptr, "parallelize_module: the group (the mesh's \"tp\" dimension) is null");
  LOOM_CHECK(!plan.empty(), "parallelize_module: the plan is empty; name the layers to split, as "
             "{{\"fc1\", ColwiseParallel()}, {\"fc2\", RowwiseParallel()}}");
  broadcast_from_rank0(module, *group);
  StatePlacements placements;
  std::map<std::string, std::string> claimed;  // module name -> the pattern that split it
  for (const PlanEntry& entry : plan) {
    LOOM_CHECK(entry.style != nullptr, "parallelize_module: the plan's entry '", entry.pattern, "' has no style");
    int matched = 0;
    for (const auto& [name, child] : module.named_modules()) {
      if (name.empty() || !matches_module_pattern(entry.pattern, name)) continue;
      const std::string module_name = name;  // Note [doctest messages name no structured binding]
      auto [previous, inserted] = claimed.emplace(module_name, entry.pattern);
      LOOM_CHECK(inserted, "parallelize_module: '", module_name, "' is matched by both '", previous->second,
                 "' and '", entry.pattern, "'; a module gets one style");
      entry.style->apply(*child, module_name, group, placements);
      ++matched;
    }
    LOOM_CHECK(matched > 0, "parallelize_module: the plan names '", entry.pattern, "', which matches no module of ",
               "the ", module.type_name(), " (its modules: ", module_names(module), ")");
  }
  return placements;
}

StatePlacements parallelize_module(nn::Module& module, const std::shared_ptr<Communicator>& group,
                                   const ParallelStyle& style) {
  LOOM_CHECK(group != nullptr, "parallelize_module: the group (the mesh's \"tp\" dimension) is null");
  broadcast_from_rank0(module, *group);
  StatePlacements placements;
  style.apply(module, "", group, placements);
  return placements;
}

}  // namespace loom::distributed
