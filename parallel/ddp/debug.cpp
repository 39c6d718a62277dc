#include "parallel/ddp/debug.h"

#include <cctype>
#include <cstdlib>
#include <map>

#include "core/error.h"
#include "core/factory.h"

namespace loom::ddp {

DebugLevel debug_level_from_env() {
  const char* value = std::getenv("LOOM_DISTRIBUTED_DEBUG");
  if (!value || !*value) return DebugLevel::Off;
  std::string v = value;
  for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (v == "off") return DebugLevel::Off;
  if (v == "info") return DebugLevel::Info;
  if (v == "detail") return DebugLevel::Detail;
  LOOM_FAIL("LOOM_DISTRIBUTED_DEBUG='", value, "': expected OFF, INFO or DETAIL (any case)");
}

std::array<int64_t, 9> CollectiveCall::words() const {
  return {sequence, iteration, static_cast<int64_t>(purpose), bucket, dtype, numel, num_params, first_param,
          last_param};
}

CollectiveCall CollectiveCall::from_words(const int64_t* w) {
  return CollectiveCall{w[0], w[1], static_cast<CollectivePurpose>(w[2]), w[3], w[4], w[5], w[6], w[7], w[8]};
}

static std::string param_name(const std::vector<std::string>& names, int64_t index) {
  if (index >= 0 && static_cast<size_t>(index) < names.size()) return names[static_cast<size_t>(index)];
  return detail::str("parameter #", index);
}

std::string CollectiveCall::describe(const std::vector<std::string>& names) const {
  std::string what;
  switch (purpose) {
    case CollectivePurpose::ParameterBroadcast: what = "broadcast of parameters and buffers"; break;
    case CollectivePurpose::BufferBroadcast: what = "broadcast of buffers"; break;
    case CollectivePurpose::UsedParameters: what = "all_reduce of the used-parameter map"; break;
    case CollectivePurpose::BucketAllReduce:
      what = detail::str("all_reduce of bucket ", bucket, " (", num_params, " parameter", num_params == 1 ? "" : "s");
      if (num_params > 0) {
        what += ": " + param_name(names, first_param);
        if (num_params > 1) what += " ... " + param_name(names, last_param);
      }
      what += ")";
      break;
  }
  return detail::str("DDP collective #", sequence, ", iteration ", iteration, ": ", what, ", ",
                     dtype_name(static_cast<DType>(dtype)), " [", numel, "]");
}

Announcement::Announcement(distributed::Communicator& comm, const CollectiveCall& call)
    : mine_(call), rank_(comm.rank()) {
  auto w = call.words();
  // See Note [Metadata tensors travel on the communicator's device] (communicator.h).
  Tensor fingerprint = distributed::to_communication_device(
      from_vector<int64_t>(std::vector<int64_t>(w.begin(), w.end()), {int64_t(w.size())}), comm);
  work_ = comm.all_gather(gathered_, fingerprint);
}

void Announcement::check(const std::vector<std::string>& names) const {
  if (!work_) return;
  work_->wait();
  bool agree = true;
  std::vector<CollectiveCall> calls;
  for (const Tensor& t : gathered_) {
    const std::vector<int64_t> words = t.tolist<int64_t>();  // a host copy, also of CUDA tensors
    calls.push_back(CollectiveCall::from_words(words.data()));
    agree = agree && calls.back() == calls.front();
  }
  if (agree) return;
  // Group ranks by what they meant, as the communicator's own check does.
  std::map<std::string, std::string> ranks_by_call;
  for (size_t r = 0; r < calls.size(); ++r) {
    std::string& ranks = ranks_by_call[calls[r].describe(names)];
    ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  }
  std::string views;
  for (const auto& [call, ranks] : ranks_by_call)
    views += detail::str("\n  rank", ranks.find(',') == std::string::npos ? " " : "s ", ranks, ": ", call);
  LOOM_FAIL("DistributedDataParallel (LOOM_DISTRIBUTED_DEBUG=detail): the ranks disagree about DDP collective #",
            mine_.sequence, ":", views,
            "\nEvery rank must run the same sequence of DDP forwards and backwards with the same model and the same "
            "DDP options (bucket_cap_mb, find_unused_parameters): check for a rank that ran an extra step, skipped "
            "no_sync(), or was built with different options. (Parameter names by registration index, as rank ", rank_,
            " sees them.)");
}

Announcement Announcer::announce(CollectiveCall call, const Tensor& tensor) {
  call.sequence = next_sequence_++;
  call.dtype = static_cast<int64_t>(tensor.dtype());
  call.numel = tensor.numel();
  if (level_ != DebugLevel::Detail) return {};
  return Announcement(comm_, call);
}

}  // namespace loom::ddp
