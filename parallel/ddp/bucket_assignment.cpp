#include "parallel/ddp/bucket_assignment.h"

#include <algorithm>
#include <map>
#include <utility>

#include "core/error.h"

namespace loom::ddp {

std::vector<std::vector<size_t>> compute_bucket_assignment_by_size(const std::vector<ParameterInfo>& params,
                                                                   const std::vector<size_t>& size_limits) {
  LOOM_CHECK(!size_limits.empty(), "bucket assignment needs at least one size limit");
  struct OpenBucket {
    std::vector<size_t> indices;
    size_t bytes = 0;
    size_t limit_index = 0;  // which of size_limits applies to this bucket
  };
  // One open bucket per (dtype, device): see Note [Bucket order].
  std::map<std::pair<int, std::pair<int, int>>, OpenBucket> open;
  std::vector<std::vector<size_t>> closed;

  for (size_t k = params.size(); k-- > 0;) {
    const ParameterInfo& p = params[k];
    auto key = std::make_pair(static_cast<int>(p.dtype), std::make_pair(static_cast<int>(p.device.type), p.device.index));
    OpenBucket& bucket = open[key];
    bucket.indices.push_back(k);
    bucket.bytes += static_cast<size_t>(p.numel) * element_size(p.dtype);
    size_t limit = size_limits[std::min(bucket.limit_index, size_limits.size() - 1)];
    if (bucket.bytes >= limit) {
      closed.push_back(std::move(bucket.indices));
      bucket.indices.clear();
      bucket.bytes = 0;
      bucket.limit_index += 1;
    }
  }
  // Partially filled buckets close last, in the order their first parameter arrived.
  std::vector<std::vector<size_t>> leftovers;
  for (auto& [key, bucket] : open)
    if (!bucket.indices.empty()) leftovers.push_back(std::move(bucket.indices));
  std::sort(leftovers.begin(), leftovers.end(), [](const auto& a, const auto& b) { return a.front() > b.front(); });
  for (auto& bucket : leftovers) closed.push_back(std::move(bucket));
  return closed;
}

std::vector<std::vector<size_t>> split_last_bucket(std::vector<std::vector<size_t>> buckets,
                                                   const std::vector<ParameterInfo>& params, size_t last_bucket_bytes) {
  if (buckets.empty()) return buckets;
  auto bytes_of = [&](size_t i) { return static_cast<size_t>(params[i].numel) * element_size(params[i].dtype); };
  std::vector<size_t>& last = buckets.back();
  // The last bucket's parameters were added from the latest registered to the earliest:
  // its tail holds the first-registered ones, the last to get their gradients.
  size_t tail_bytes = 0, keep = last.size();
  while (keep > 0 && tail_bytes + bytes_of(last[keep - 1]) <= last_bucket_bytes) tail_bytes += bytes_of(last[--keep]);
  if (keep == last.size()) keep = last.size() - 1;  // a parameter larger than the limit: alone at the end
  if (keep == 0) return buckets;                      // the whole bucket is small already
  std::vector<size_t> tail(last.begin() + static_cast<std::ptrdiff_t>(keep), last.end());
  last.resize(keep);
  buckets.push_back(std::move(tail));
  return buckets;
}

}  // namespace loom::ddp
