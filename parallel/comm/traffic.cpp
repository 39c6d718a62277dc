#include "parallel/comm/traffic.h"

#include <cstdio>

#include "core/error.h"  // defines: LOOM_CHECK, detail::str

namespace loom::distributed {

KindTraffic& Traffic::operator[](OpKind kind) {
  switch (kind) {
    case OpKind::AllReduce: return all_reduce;
    case OpKind::AllGather: return all_gather;
    case OpKind::ReduceScatter: return reduce_scatter;
    case OpKind::Broadcast: return broadcast;
    case OpKind::Send: return send;
    case OpKind::Recv: return recv;
    case OpKind::Barrier: return barrier;
  }
  LOOM_FAIL("Traffic: unknown collective kind ", int(kind));
}

const KindTraffic& Traffic::operator[](OpKind kind) const { return const_cast<Traffic&>(*this)[kind]; }

int64_t Traffic::total_bytes() const {
  int64_t sum = 0;
  for (OpKind kind : kTrafficKinds) sum += (*this)[kind].bytes;
  return sum;
}

int64_t Traffic::total_calls() const {
  int64_t sum = 0;
  for (OpKind kind : kTrafficKinds) sum += (*this)[kind].calls;
  return sum;
}

Traffic Traffic::operator-(const Traffic& before) const {
  Traffic out = *this;
  for (OpKind kind : kTrafficKinds) {
    out[kind].calls -= before[kind].calls;
    out[kind].bytes -= before[kind].bytes;
    out[kind].payload_bytes -= before[kind].payload_bytes;
  }
  return out;
}

Traffic& Traffic::operator+=(const Traffic& other) {
  for (OpKind kind : kTrafficKinds) {
    (*this)[kind].calls += other[kind].calls;
    (*this)[kind].bytes += other[kind].bytes;
    (*this)[kind].payload_bytes += other[kind].payload_bytes;
  }
  return *this;
}

// "40 B", "1.2 KB", "43.1 MB": decimal units, as bandwidths are quoted.
static std::string format_bytes(int64_t bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while ((value >= 1000 || value <= -1000) && unit < 4) {
    value /= 1000;
    ++unit;
  }
  char buf[32];
  if (unit == 0) std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  else std::snprintf(buf, sizeof buf, "%.1f %s", value, units[unit]);
  return buf;
}

std::string Traffic::str() const {
  std::string out;
  for (OpKind kind : kTrafficKinds) {
    const KindTraffic& k = (*this)[kind];
    if (k.calls == 0) continue;
    if (!out.empty()) out += "; ";
    out += detail::str(op_kind_name(kind), ": ", k.calls, k.calls == 1 ? " call" : " calls");
    if (kind == OpKind::Barrier) continue;
    out += detail::str(", ", format_bytes(k.bytes));
    if (k.payload_bytes != k.bytes) out += detail::str(" (payload ", format_bytes(k.payload_bytes), ")");
  }
  return out.empty() ? "no communication" : out;
}

// Note [Bytes a collective moves] (traffic.h). The products come before the division:
// (N-1)/N in integers is 0.
int64_t bus_bytes(OpKind kind, int64_t payload_bytes, int group_size) {
  LOOM_CHECK(group_size >= 1, "bus_bytes: expected a group size >= 1, got ", group_size);
  LOOM_CHECK(payload_bytes >= 0, "bus_bytes: expected a payload of >= 0 bytes, got ", payload_bytes);
  const int64_t n = group_size, s = payload_bytes;
  switch (kind) {
    case OpKind::AllReduce: return (2 * (n - 1) * s + n / 2) / n;  // rounded to the nearest byte
    case OpKind::AllGather:
    case OpKind::ReduceScatter: return (n - 1) * s / n;  // s = n * shard: exact
    case OpKind::Broadcast: return n > 1 ? s : 0;
    case OpKind::Send:
    case OpKind::Recv: return s;
    case OpKind::Barrier: return 0;
  }
  LOOM_FAIL("bus_bytes: unknown collective kind ", int(kind));
}

void TrafficCounter::add(OpKind kind, int64_t bytes, int64_t payload_bytes) {
  Slot& slot = slots_[static_cast<size_t>(kind)];
  slot.calls.fetch_add(1, std::memory_order_relaxed);
  slot.bytes.fetch_add(bytes, std::memory_order_relaxed);
  slot.payload_bytes.fetch_add(payload_bytes, std::memory_order_relaxed);
}

Traffic TrafficCounter::snapshot() const {
  Traffic out;
  for (OpKind kind : kTrafficKinds) {
    const Slot& slot = slots_[static_cast<size_t>(kind)];
    out[kind] = {slot.calls.load(std::memory_order_relaxed), slot.bytes.load(std::memory_order_relaxed),
                 slot.payload_bytes.load(std::memory_order_relaxed)};
  }
  return out;
}

void TrafficCounter::reset() {
  for (Slot& slot : slots_) {
    slot.calls.store(0, std::memory_order_relaxed);
    slot.bytes.store(0, std::memory_order_relaxed);
    slot.payload_bytes.store(0, std::memory_order_relaxed);
  }
}

// A function-local static: communicators made during static initialisation (none today)
// would still find it constructed.
static TrafficCounter& process_counter() {
  static TrafficCounter counter;
  return counter;
}

Traffic process_traffic() { return process_counter().snapshot(); }

void reset_process_traffic() { process_counter().reset(); }

void record_traffic(TrafficCounter& counter, OpKind kind, int64_t payload_bytes, int group_size) {
  const int64_t bytes = bus_bytes(kind, payload_bytes, group_size);
  counter.add(kind, bytes, payload_bytes);
  process_counter().add(kind, bytes, payload_bytes);
}

std::string traffic_json(const Traffic& traffic, int64_t steps) {
  LOOM_CHECK(steps >= 1, "traffic_json: expected a number of steps >= 1, got ", steps);
  std::string out = "{";
  for (OpKind kind : kTrafficKinds) {
    if (kind == OpKind::Barrier) continue;
    if (out.size() > 1) out += ", ";
    const int64_t bytes = traffic[kind].bytes;
    const int64_t per_step = bytes >= 0 ? (bytes + steps / 2) / steps : -((-bytes + steps / 2) / steps);
    out += detail::str("\"", op_kind_name(kind), "\": ", per_step);
  }
  return out + "}";
}

}  // namespace loom::distributed
