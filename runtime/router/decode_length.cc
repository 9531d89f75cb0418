#include "runtime/router/decode_length.h"

#include <algorithm>

#include "runtime/common/check.h"

namespace eldr {

DecodeLengthPrior::Lengths DecodeLengthPrior::Make(std::vector<int64_t> lens) {
  for (int64_t& v : lens) v = std::max<int64_t>(v, 1);  // as calibration weighs them (a usable request has one)
  Lengths l;
  std::sort(lens.begin(), lens.end());
  l.suffix.assign(lens.size() + 1, 0.0);
  for (size_t i = lens.size(); i-- > 0;) l.suffix[i] = l.suffix[i + 1] + static_cast<double>(lens[i]);
  l.sorted = std::move(lens);
  return l;
}

DecodeLengthPrior::DecodeLengthPrior(const std::vector<int64_t>& decode_lens, const std::vector<int32_t>& assignment,
                                     int num_clusters, const std::vector<double>& prior)
    : prior_(prior) {
  if (decode_lens.empty()) return;
  ELDR_CHECK(assignment.size() == decode_lens.size(),
             "decode lengths [" << decode_lens.size() << "] and assignment [" << assignment.size() << "] differ");
  std::vector<std::vector<int64_t>> members(num_clusters);
  for (size_t i = 0; i < decode_lens.size(); ++i) {
    ELDR_CHECK(assignment[i] >= 0 && assignment[i] < num_clusters, "assignment " << assignment[i]);
    members[assignment[i]].push_back(decode_lens[i]);
  }
  for (auto& m : members) cluster_.push_back(Make(std::move(m)));
  all_ = Make(decode_lens);
}

double DecodeLengthPrior::Residual(const Lengths& l, int64_t g) {
  const size_t i = std::upper_bound(l.sorted.begin(), l.sorted.end(), g) - l.sorted.begin();
  const size_t n = l.sorted.size() - i;
  if (n == 0) return -1;
  return l.suffix[i] / static_cast<double>(n) - static_cast<double>(g);
}

double DecodeLengthPrior::Remaining(int cluster, int64_t generated) const {
  if (cluster < 0) return 1.0;
  if (!has_lengths()) {
    const double p = cluster < static_cast<int>(prior_.size()) ? prior_[cluster] : 1.0;
    return std::max(1.0, p - static_cast<double>(generated));
  }
  double r = cluster < static_cast<int>(cluster_.size()) ? Residual(cluster_[cluster], generated) : -1;
  if (r < 0) r = Residual(all_, generated);
  return std::max(1.0, r);
}

}  // namespace eldr
