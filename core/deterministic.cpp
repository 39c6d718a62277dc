#include "core/deterministic.h"

#include <atomic>

#include "core/error.h"

namespace loom {
namespace {
std::atomic<bool> g_deterministic{false};
}  // namespace

void use_deterministic_algorithms(bool mode) { g_deterministic.store(mode); }
bool are_deterministic_algorithms_enabled() { return g_deterministic.load(); }

void alert_not_deterministic(const std::string& caller, const std::string& instead) {
  if (!g_deterministic.load()) return;
  LOOM_FAIL(caller, " does not have a deterministic implementation (two runs could train different weights), "
            "but use_deterministic_algorithms(true) (--deterministic) asks for runs that repeat bit for bit",
            instead.empty() ? "" : "; ", instead, ". See docs/reproducibility.md for what the switch rules out.");
}

}  // namespace loom
