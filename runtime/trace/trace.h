// Routing traces: which experts each token of each request was routed to, per MoE layer
// (DESIGN.md §5). Tokens [0, prompt_len) of a request are prefill, the rest decode.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/common/status.h"

namespace eldr {

struct TraceShape {
  std::string model;    // free text, may be empty
  int num_layers = 0;   // MoE layers recorded (L)
  int num_experts = 0;  // routed experts per layer (E), < 65536
  int top_k = 0;        // experts per token per layer (k)

  bool SameAs(const TraceShape& o) const {
    return num_layers == o.num_layers && num_experts == o.num_experts && top_k == o.top_k;
  }
  std::string ToString() const;  // "L=26 E=64 k=6"
};

struct TraceRequest {
  std::string id;
  std::string domain;      // "" when the trace has no label
  int64_t prompt_len = 0;  // prefill tokens
  int64_t num_tokens = 0;  // prefill + decode tokens
  int64_t offset = 0;      // first token's row in Trace::topk_ids
  int64_t decode_len() const { return num_tokens - prompt_len; }
};

struct Trace {
  TraceShape shape;
  std::vector<TraceRequest> requests;
  std::vector<uint16_t> topk_ids;   // [num_tokens_total, L, k]
  std::vector<float> topk_weights;  // [num_tokens_total, L, k], or empty when the trace has none

  bool has_weights() const { return !topk_weights.empty(); }
  int64_t num_tokens_total() const;
  size_t token_stride() const { return static_cast<size_t>(shape.num_layers) * shape.top_k; }
  // The [L, k] expert ids of token `t` (a global row).
  const uint16_t* token_ids(int64_t t) const { return topk_ids.data() + t * token_stride(); }
  const float* token_weights(int64_t t) const { return topk_weights.data() + t * token_stride(); }
  // Distinct domain labels in order of first appearance ("" included if present).
  std::vector<std::string> Domains() const;
};

// The limits of the trace format, which every reader enforces and every writer (synth, import, WriteTrace,
// TraceWriter) checks first, so that nothing is written that a reader would reject.
constexpr int kMaxTraceLayers = 4096;
constexpr int kMaxTraceExperts = 65535;                   // ids are uint16
constexpr int64_t kMaxRequestEntries = int64_t{1} << 31;  // routing entries of one request: tokens x L x top-k
// Routing entries [T, L, k] a generated trace may have (32 GiB of ids): `trace synth` refuses more up front, with
// or without --like, instead of running out of memory, disk or patience.
constexpr double kMaxSynthEntries = static_cast<double>(int64_t{1} << 34);
// InvalidArgument "NAME: num_layers L must be in [1, 4096]" (and the same for E and k <= E) unless the shape is
// one a reader accepts.
Status ValidateTraceShape(int64_t num_layers, int64_t num_experts, int64_t top_k, const std::string& name);
// Gate weights as the reader checks them: finite (as float: 1e39 is not) and >= 0. `w`: [n]; `stride` = L·k
// numbers the tokens in the message from `first_token`.
Status ValidateTopkWeights(const float* w, size_t n, size_t stride, int64_t first_token, const std::string& name);

// The request-table invariants of ValidateTrace: unique ids, positive lengths, prompt_len <= num_tokens, offsets
// contiguous from 0 covering exactly `num_tokens_total` tokens. `name` prefixes the error.
Status ValidateTraceRequests(const std::vector<TraceRequest>& requests, int64_t num_tokens_total,
                             const std::string& name);

// Checks every invariant of a trace (shapes, ids < E, distinct ids per token and layer, lengths,
// offsets, finite non-negative weights). `name` prefixes the error.
Status ValidateTrace(const Trace& trace, const std::string& name);

struct TraceReadOptions {
  bool weights = true;        // false: /tokens/topk_weights is not read (Trace::topk_weights stays empty)
  bool direct_chunks = true;  // decompress chunks on several threads (h5::File::ReadParallel); false: plain H5Dread
  int num_threads = 0;        // for direct_chunks; 0: DefaultThreads()
};

// HDF5 trace store (DESIGN.md §5). Read validates the file fully. Both read paths give the same Trace.
Result<Trace> ReadTrace(const std::string& path);
Result<Trace> ReadTrace(const std::string& path, const TraceReadOptions& options);

// How the trace writer stores /tokens/topk_ids and /tokens/topk_weights: chunks of `chunk_rows` tokens
// (0: about `chunk_bytes` of ids per chunk), filtered by shuffle and deflate. The defaults are the storage of
// every trace written so far: deflate 1 reads no faster than 4 (h5py, the benchmark trace: 1.22 s vs 1.17 s for
// the ids) and is 3 % larger; the read speed comes from the parallel inflate. With calibrate's streaming read
// (ReadTraceCounts) chunks of 341-2730 tokens, deflate 1 or 6, or no shuffle read no faster either (bench/README.md
// "Offline calibration").
struct TraceStorage {
  int64_t chunk_rows = 0;
  int64_t chunk_bytes = int64_t{1} << 19;
  bool shuffle = true;
  int deflate_level = 4;
  // The storage of traces written before TraceStorage existed: 2^18 ids per chunk, shuffle, deflate 4.
  static TraceStorage Legacy() { return TraceStorage{0, int64_t{1} << 19, true, 4}; }
};
// Written to a temporary and renamed; no partial file on failure.
Status WriteTrace(const Trace& trace, const std::string& path, const TraceStorage& storage = TraceStorage());

struct ImportSummary {
  int64_t num_requests = 0;
  int64_t num_tokens = 0;
  TraceShape shape;
  bool has_weights = false;
};

// Streams a JSONL (optionally gzip-compressed) routing trace into the HDF5 trace format. Every line is
// validated; the first bad line fails the import with "<in>:<line>: <problem>" and no output file. A record holds
// exactly the fields of DESIGN.md §5 (id, domain, model, num_layers, num_experts, top_k, num_tokens, prompt_len,
// topk_ids, topk_weights); any other is "unknown field 'X' (did you mean 'Y'?); a record's fields are ...".
// Memory is bounded by one request plus per-request metadata.
Status ImportJsonlTrace(const std::string& in_path, const std::string& out_path, ImportSummary* summary);

}  // namespace eldr
