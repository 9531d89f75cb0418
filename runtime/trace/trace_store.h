// Streaming writer of the HDF5 trace format (DESIGN.md §5): requests are appended one at a time so
// that memory is bounded by one request. The file is written under a temporary name and renamed by
// Finish(); destroying an unfinished writer removes the temporary.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/common/atomic_file.h"
#include "runtime/common/hdf5.h"
#include "runtime/trace/trace.h"

namespace eldr {

class TraceWriter {
 public:
  static Result<std::unique_ptr<TraceWriter>> Open(const std::string& path, const TraceShape& shape, bool with_weights,
                                                   const TraceStorage& storage = TraceStorage());
  // ids: [num_tokens, L, k]; weights: same shape, or empty when the writer has no weights.
  // request.offset is assigned by the writer.
  Status Append(const TraceRequest& request, const uint16_t* ids, const float* weights);
  Status Finish();
  int64_t num_requests() const { return static_cast<int64_t>(requests_.size()); }
  int64_t num_tokens() const { return num_tokens_; }

 private:
  TraceWriter(std::string path) : out_(std::move(path)) {}
  AtomicOutput out_;
  std::unique_ptr<h5::File> file_;
  std::unique_ptr<h5::Appender> ids_, weights_;
  TraceShape shape_;
  std::vector<TraceRequest> requests_;  // metadata only
  int64_t num_tokens_ = 0;
};

}  // namespace eldr
