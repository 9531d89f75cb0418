// Streaming writer of the HDF5 trace format (DESIGN.md §5): requests are appended one at a time so
// that memory is bounded by one request. The file is written under a temporary name and renamed by
// Finish(); destroying an unfinished writer removes the temporary.
#pragma once

#include <functional>
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

// Receives validated expert ids of tokens [first_token, first_token + num_tokens): ids [num_tokens, L, k], valid
// during the call only. `worker` in [0, TraceStreamReader::NumWorkers(options)) names the calling thread (no two
// calls in flight share one).
using TraceTokenConsumer =
    std::function<void(int64_t first_token, int64_t num_tokens, const uint16_t* ids, int worker)>;

// Streaming reader of the HDF5 trace format: the request table first, then /tokens/topk_ids in blocks of whole
// tokens as its chunks inflate on several threads, so a caller can reduce the tokens (count them per request)
// without holding them. Accepts and rejects exactly the files ReadTrace(path, {weights = false}) does, with the
// same messages when a file has one fault; /tokens/topk_weights is never read. Not thread-safe (one ReadIds at a
// time); ReadIds itself calls the consumer from several threads.
class TraceStreamReader {
 public:
  // Opens `path` and reads the shape and requests, validated as ReadTrace validates them (duplicate ids, lengths,
  // contiguous offsets covering /tokens/topk_ids).
  static Result<std::unique_ptr<TraceStreamReader>> Open(const std::string& path);
  ~TraceStreamReader();
  // Shape and requests; topk_ids and topk_weights are empty.
  const Trace& header() const { return header_; }
  int64_t num_tokens_total() const { return num_tokens_total_; }
  // Worker threads ReadIds uses: options.num_threads, or DefaultThreads() when <= 0.
  static int NumWorkers(const TraceReadOptions& options);
  // Streams every token once to `consume`, concurrently, in no fixed order (blocks are the file's chunks; with
  // options.direct_chunks false or a layout the direct read does not take, HDF5's own read in ~1 MiB blocks).
  // Each block is validated before it is consumed (ids < E, distinct within a token's top-k); on a bad token the
  // error is ValidateTrace's for the lowest bad token and later blocks may or may not have been consumed, so a
  // caller discards what it accumulated on any error.
  Status ReadIds(const TraceReadOptions& options, const TraceTokenConsumer& consume);

 private:
  explicit TraceStreamReader(std::string path) : path_(std::move(path)) {}
  std::string path_;
  std::unique_ptr<h5::File> file_;
  Trace header_;
  int64_t num_tokens_total_ = 0;
};

}  // namespace eldr
