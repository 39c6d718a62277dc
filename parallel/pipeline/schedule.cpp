#include "parallel/pipeline/schedule.h"

#include <algorithm>

#include "core/error.h"

namespace loom::parallel::pipeline {

static void check_sizes(int64_t stages, int64_t micro_batches) {
  LOOM_CHECK(stages >= 1 && micro_batches >= 1, "pipeline schedule: expected at least one stage and one "
             "micro-batch, got ", stages, " stages and ", micro_batches, " micro-batches");
}

std::vector<std::vector<Action>> gpipe_order(int64_t stages, int64_t micro_batches) {
  check_sizes(stages, micro_batches);
  std::vector<std::vector<Action>> orders(static_cast<size_t>(stages));
  for (auto& order : orders) {
    for (int64_t m = 0; m < micro_batches; ++m) order.push_back({Pass::Forward, m});
    for (int64_t m = 0; m < micro_batches; ++m) order.push_back({Pass::Backward, m});
  }
  return orders;
}

std::vector<std::vector<Action>> one_f_one_b_order(int64_t stages, int64_t micro_batches) {
  check_sizes(stages, micro_batches);
  std::vector<std::vector<Action>> orders(static_cast<size_t>(stages));
  for (int64_t s = 0; s < stages; ++s) {
    auto& order = orders[size_t(s)];
    const int64_t warmup = std::min(stages - 1 - s, micro_batches);
    int64_t forward = 0, backward = 0;
    while (forward < warmup) order.push_back({Pass::Forward, forward++});
    while (forward < micro_batches) {  // steady state: one forward, one backward
      order.push_back({Pass::Forward, forward++});
      order.push_back({Pass::Backward, backward++});
    }
    while (backward < micro_batches) order.push_back({Pass::Backward, backward++});  // cool-down
  }
  return orders;
}

// See Note [Interleaved 1F1B: virtual stages].
std::vector<std::vector<Action>> interleaved_1f1b_order(int64_t stages, int64_t micro_batches,
                                                        int64_t virtual_stages) {
  check_sizes(stages, micro_batches);
  LOOM_CHECK(virtual_stages >= 1, "pipeline schedule: expected at least one virtual stage per stage, got ",
             virtual_stages);
  const int64_t S = stages, M = micro_batches, V = virtual_stages;
  // The k-th forward (backward) of every stage, as (micro-batch, local stage), over rounds of
  // at least S micro-batches each (Note [Interleaved 1F1B: virtual stages]).
  const int64_t rounds = std::max<int64_t>(1, M / S);
  std::vector<Action> forwards, backwards;
  int64_t first_round = 0;
  for (int64_t r = 0, first = 0; r < rounds; ++r) {
    const int64_t size = M / rounds + (r < M % rounds ? 1 : 0);
    if (r == 0) first_round = size;
    for (int64_t v = 0; v < V; ++v)
      for (int64_t m = first; m < first + size; ++m) forwards.push_back({Pass::Forward, m, v});
    for (int64_t v = V - 1; v >= 0; --v)
      for (int64_t m = first; m < first + size; ++m) backwards.push_back({Pass::Backward, m, v});
    first += size;
  }
  const auto total = static_cast<int64_t>(forwards.size());
  std::vector<std::vector<Action>> orders(static_cast<size_t>(S));
  for (int64_t s = 0; s < S; ++s) {
    auto& order = orders[size_t(s)];
    const int64_t warmup = std::min(2 * (S - 1 - s) + (V - 1) * first_round, total);
    int64_t forward = 0, backward = 0;
    while (forward < warmup) order.push_back(forwards[size_t(forward++)]);
    while (forward < total) {  // steady state: one forward, one backward
      order.push_back(forwards[size_t(forward++)]);
      order.push_back(backwards[size_t(backward++)]);
    }
    while (backward < total) order.push_back(backwards[size_t(backward++)]);  // cool-down
  }
  return orders;
}

// See Note [Schedules are local orders placed on a clock].
Schedule place_on_clock(const std::vector<std::vector<Action>>& orders, int64_t micro_batches,
                        int64_t virtual_stages) {
  const auto stages = static_cast<int64_t>(orders.size());
  check_sizes(stages, micro_batches);
  LOOM_CHECK(virtual_stages >= 1, "pipeline schedule: expected at least one virtual stage, got ", virtual_stages);
  const int64_t C = stages * virtual_stages;  // the model's virtual stages
  // done[pass][c][m]: the tick at which virtual stage c finished it, or -1.
  std::vector<std::vector<std::vector<int64_t>>> done(
      2, std::vector<std::vector<int64_t>>(size_t(C), std::vector<int64_t>(size_t(micro_batches), -1)));
  auto finished_before = [&](Pass pass, int64_t c, int64_t m, int64_t tick) {
    const int64_t at = done[size_t(pass)][size_t(c)][size_t(m)];
    return at >= 0 && at < tick;
  };
  for (const auto& order : orders)
    for (const Action& a : order) {
      LOOM_CHECK(a.micro_batch >= 0 && a.micro_batch < micro_batches, "pipeline schedule: micro-batch ",
                 a.micro_batch, " is out of range for ", micro_batches, " micro-batches");
      LOOM_CHECK(a.local_stage >= 0 && a.local_stage < virtual_stages, "pipeline schedule: local stage ",
                 a.local_stage, " is out of range for ", virtual_stages, " virtual stages per stage");
    }
  Schedule schedule{stages, micro_batches, virtual_stages, {}};
  std::vector<size_t> next(size_t(stages), 0);
  size_t remaining = 0;
  for (const auto& order : orders) remaining += order.size();
  for (int64_t tick = 0; remaining > 0; ++tick) {
    std::vector<std::optional<Action>> row(static_cast<size_t>(stages));
    bool progress = false;
    for (int64_t s = 0; s < stages; ++s) {
      if (next[size_t(s)] == orders[size_t(s)].size()) continue;
      const Action a = orders[size_t(s)][next[size_t(s)]];
      const int64_t c = virtual_stage(s, a.local_stage, stages);
      const bool ready =
          a.pass == Pass::Forward
              ? (c == 0 || finished_before(Pass::Forward, c - 1, a.micro_batch, tick))
              : (c == C - 1 ? finished_before(Pass::Forward, c, a.micro_batch, tick)
                                 : finished_before(Pass::Backward, c + 1, a.micro_batch, tick));
      if (!ready) continue;
      row[size_t(s)] = a;
      done[size_t(a.pass)][size_t(c)][size_t(a.micro_batch)] = tick;
      ++next[size_t(s)];
      --remaining;
      progress = true;
    }
    LOOM_CHECK(progress, "pipeline schedule: the stages' orders deadlock at tick ", tick, ": every stage waits "
               "for an action that another stage's order puts later");
    schedule.ticks.push_back(std::move(row));
  }
  for (int64_t c = 0; c < C; ++c)
    for (int64_t m = 0; m < micro_batches; ++m)
      LOOM_CHECK(done[0][size_t(c)][size_t(m)] >= 0 && done[1][size_t(c)][size_t(m)] >= 0, "pipeline schedule: stage ",
                 c % stages, "'s order lacks the forward or the backward of micro-batch ", m,
                 virtual_stages > 1 ? detail::str(" on virtual stage ", c) : std::string());
  return schedule;
}

Schedule gpipe_schedule(int64_t stages, int64_t micro_batches) {
  return place_on_clock(gpipe_order(stages, micro_batches), micro_batches);
}

Schedule one_f_one_b_schedule(int64_t stages, int64_t micro_batches) {
  return place_on_clock(one_f_one_b_order(stages, micro_batches), micro_batches);
}

Schedule interleaved_1f1b_schedule(int64_t stages, int64_t micro_batches, int64_t virtual_stages) {
  return place_on_clock(interleaved_1f1b_order(stages, micro_batches, virtual_stages), micro_batches, virtual_stages);
}

void check_schedule_name(const std::string& name) {
  LOOM_CHECK(name == "gpipe" || name == "1f1b" || name == "interleaved_1f1b",
             "pipeline schedule: expected gpipe, 1f1b or interleaved_1f1b, got '", name, "'");
}

Schedule make_schedule(const std::string& name, int64_t stages, int64_t micro_batches, int64_t virtual_stages) {
  check_schedule_name(name);
  if (name == "interleaved_1f1b") return interleaved_1f1b_schedule(stages, micro_batches, virtual_stages);
  LOOM_CHECK(virtual_stages == 1, "pipeline schedule: ", name, " runs one virtual stage per stage (V = 1), got ",
             virtual_stages, "; interleaved_1f1b runs several");
  return name == "gpipe" ? gpipe_schedule(stages, micro_batches) : one_f_one_b_schedule(stages, micro_batches);
}

std::string draw(const Schedule& schedule) {
  const bool named_local_stages = schedule.virtual_stages > 1;
  const size_t width =
      std::to_string(std::max<int64_t>(schedule.micro_batches - 1, 0)).size() + 2 + named_local_stages;
  std::string out;
  for (int64_t s = 0; s < schedule.stages; ++s) {
    out += "stage " + std::to_string(s) + ":";
    for (const auto& row : schedule.ticks) {
      std::string cell = ".";
      if (const auto& a = row[size_t(s)]) {
        cell = a->pass == Pass::Forward ? "F" : "B";
        cell += std::to_string(a->micro_batch);
        if (named_local_stages) cell += static_cast<char>('a' + a->local_stage % 26);
      }
      out += " " + cell + std::string(width - cell.size() - 1, ' ');
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    out += "\n";
  }
  return out;
}

int64_t peak_activations(const Schedule& schedule, int64_t stage) {
  int64_t held = 0, peak = 0;
  for (const auto& row : schedule.ticks) {
    if (const auto& a = row.at(size_t(stage))) held += a->pass == Pass::Forward ? 1 : -1;
    peak = std::max(peak, held);
  }
  return peak;
}

double bubble_fraction(const Schedule& schedule) {
  int64_t idle = 0, total = 0;
  for (const auto& row : schedule.ticks)
    for (const auto& a : row) {
      ++total;
      if (!a) ++idle;
    }
  return total ? static_cast<double>(idle) / static_cast<double>(total) : 0.0;
}

}  // namespace loom::parallel::pipeline
