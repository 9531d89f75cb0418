#include "runtime/trace/trace.h"

#include <atomic>
#include <cmath>
#include <limits>
#include <mutex>
#include <type_traits>
#include <unordered_set>

#include "runtime/common/hdf5.h"
#include "runtime/common/parallel.h"
#include "runtime/common/signals.h"
#include "runtime/trace/trace_store.h"

namespace eldr {

namespace {
constexpr int64_t kTraceFormatVersion = 1;
}

std::string TraceShape::ToString() const {
  return "L=" + std::to_string(num_layers) + " E=" + std::to_string(num_experts) + " k=" + std::to_string(top_k);
}

int64_t Trace::num_tokens_total() const {
  size_t stride = token_stride();
  return stride == 0 ? 0 : static_cast<int64_t>(topk_ids.size() / stride);
}

std::vector<std::string> Trace::Domains() const {
  std::vector<std::string> out;
  std::unordered_set<std::string> seen;
  for (const auto& r : requests) {
    if (seen.insert(r.domain).second) out.push_back(r.domain);
  }
  return out;
}

Status ValidateTraceShape(int64_t num_layers, int64_t num_experts, int64_t top_k, const std::string& name) {
  auto bad = [&](const char* what, int64_t v, int64_t hi, const char* hi_name) {
    return Status::InvalidArgument(name + ": " + what + " " + std::to_string(v) + " must be in [1, " +
                                   std::to_string(hi) + "]" + hi_name);
  };
  if (num_layers < 1 || num_layers > kMaxTraceLayers) {
    return bad("num_layers", num_layers, kMaxTraceLayers, " (the trace format's limit)");
  }
  if (num_experts < 1 || num_experts > kMaxTraceExperts) {
    return bad("num_experts", num_experts, kMaxTraceExperts, " (expert ids are 16-bit)");
  }
  if (top_k < 1 || top_k > num_experts) return bad("top_k", top_k, num_experts, " (num_experts)");
  return Status::Ok();
}

Status ValidateTopkWeights(const float* w, size_t n, size_t stride, int64_t first_token, const std::string& name) {
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(w[i]) || w[i] < 0) {
      return Status::InvalidArgument(name + ": topk_weights has a NaN, infinite or negative value at token " +
                                     std::to_string(first_token + static_cast<int64_t>(i / stride)));
    }
  }
  return Status::Ok();
}

Status ValidateTraceRequests(const std::vector<TraceRequest>& requests, int64_t num_tokens_total,
                             const std::string& name) {
  int64_t expected_offset = 0;
  std::unordered_set<std::string> ids;
  for (size_t r = 0; r < requests.size(); ++r) {
    const auto& req = requests[r];
    const std::string where = name + ": request " + std::to_string(r) + " ('" + req.id + "')";
    if (req.id.empty()) return Status::Corrupt(where + ": empty request id");
    if (!ids.insert(req.id).second) return Status::Corrupt(where + ": duplicate request id");
    if (req.num_tokens <= 0) return Status::Corrupt(where + ": num_tokens must be positive");
    if (req.prompt_len < 0 || req.prompt_len > req.num_tokens) {
      return Status::Corrupt(where + ": prompt_len must be in [0, num_tokens]");
    }
    if (req.offset != expected_offset) return Status::Corrupt(where + ": offsets are not contiguous");
    expected_offset += req.num_tokens;
  }
  if (expected_offset != num_tokens_total) {
    return Status::Corrupt(name + ": requests cover " + std::to_string(expected_offset) + " tokens but topk_ids has " +
                           std::to_string(num_tokens_total));
  }
  return Status::Ok();
}

namespace {

// The per-thread state of ValidateTokenIds: last_seen[e] = the (token, layer) stamp that last held expert e.
struct IdCheckState {
  std::vector<int64_t> last_seen;
  int64_t stamp = 0;
};

// Every id of tokens [first_token, first_token + num_tokens) is < E and distinct within its (token, layer) top-k.
// ids: [num_tokens, L, k].
Status ValidateTokenIds(const uint16_t* ids, int64_t num_tokens, int64_t first_token, const TraceShape& s,
                        const std::string& name, IdCheckState* state) {
  state->last_seen.resize(s.num_experts, -1);
  int64_t& stamp = state->stamp;
  const size_t stride = static_cast<size_t>(s.num_layers) * s.top_k;
  for (int64_t i = 0; i < num_tokens; ++i) {
    const uint16_t* row = ids + i * stride;
    for (int l = 0; l < s.num_layers; ++l, ++stamp) {
      for (int j = 0; j < s.top_k; ++j) {
        uint16_t e = row[l * s.top_k + j];
        if (e >= s.num_experts || state->last_seen[e] == stamp) {
          const std::string where = name + ": token " + std::to_string(first_token + i) + " layer " + std::to_string(l);
          if (e >= s.num_experts) {
            return Status::Corrupt(where + ": expert id " + std::to_string(e) + " >= num_experts " +
                                   std::to_string(s.num_experts));
          }
          return Status::Corrupt(where + ": expert " + std::to_string(e) + " repeated within top-k");
        }
        state->last_seen[e] = stamp;
      }
    }
  }
  return Status::Ok();
}

}  // namespace

Status ValidateTrace(const Trace& trace, const std::string& name) {
  const auto& s = trace.shape;
  ELDR_RETURN_IF_ERROR(ValidateTraceShape(s.num_layers, s.num_experts, s.top_k, name));
  const size_t stride = trace.token_stride();
  if (trace.topk_ids.size() % stride != 0) return Status::Corrupt(name + ": topk_ids size is not a multiple of L*k");
  const int64_t total = trace.num_tokens_total();
  if (trace.has_weights() && trace.topk_weights.size() != trace.topk_ids.size()) {
    return Status::Corrupt(name + ": topk_weights and topk_ids differ in size");
  }
  ELDR_RETURN_IF_ERROR(ValidateTraceRequests(trace.requests, total, name));
  IdCheckState state;
  ELDR_RETURN_IF_ERROR(ValidateTokenIds(trace.topk_ids.data(), total, 0, s, name, &state));
  if (trace.has_weights()) {
    ELDR_RETURN_IF_ERROR(ValidateTopkWeights(trace.topk_weights.data(), trace.topk_weights.size(), stride, 0, name));
  }
  return Status::Ok();
}

namespace {

// The root attributes of a trace file: its format and model shape.
Status ReadTraceShape(const h5::File& f, const std::string& path, TraceShape* shape) {
  // Both root attributes are required (DESIGN.md §5): a file without them is not known to follow this layout.
  if (!f.HasAttribute("/", "format")) {
    return Status::InvalidArgument(path + ": not an eldr routing trace (no root attribute format = 'eldr-trace'); " +
                                   "write one with 'eldr trace import' or 'eldr trace synth'");
  }
  ELDR_ASSIGN_OR_RETURN(const std::string fmt, f.ReadStringAttribute("/", "format"));
  if (fmt != "eldr-trace") return Status::InvalidArgument(path + ": is a '" + fmt + "' file, not a routing trace");
  if (!f.HasAttribute("/", "format_version")) {
    return Status::InvalidArgument(path + ": trace without the root attribute format_version (this eldr reads " +
                                   std::to_string(kTraceFormatVersion) + ")");
  }
  ELDR_ASSIGN_OR_RETURN(const int64_t version, f.ReadIntAttribute("/", "format_version"));
  if (version != kTraceFormatVersion) {
    return Status::InvalidArgument(path + ": trace format_version " + std::to_string(version) +
                                   " is not supported (this eldr reads " + std::to_string(kTraceFormatVersion) + ")");
  }
  if (f.Exists("/tokens/topk_ids") == false) {
    return Status::InvalidArgument(
        path + ": not a routing trace (no /tokens/topk_ids); import JSONL with 'eldr trace import'");
  }
  ELDR_ASSIGN_OR_RETURN(shape->model, f.ReadStringAttribute("/", "model"));
  ELDR_ASSIGN_OR_RETURN(int64_t L, f.ReadIntAttribute("/", "num_layers"));
  ELDR_ASSIGN_OR_RETURN(int64_t E, f.ReadIntAttribute("/", "num_experts"));
  ELDR_ASSIGN_OR_RETURN(int64_t K, f.ReadIntAttribute("/", "top_k"));
  ELDR_RETURN_IF_ERROR(ValidateTraceShape(L, E, K, path + ": model shape attribute"));
  shape->num_layers = static_cast<int>(L);
  shape->num_experts = static_cast<int>(E);
  shape->top_k = static_cast<int>(K);
  return Status::Ok();
}

Status CheckIdDims(const h5::Dims& dims, const TraceShape& shape, const std::string& path) {
  if (dims.size() != 3 || dims[1] != static_cast<hsize_t>(shape.num_layers) ||
      dims[2] != static_cast<hsize_t>(shape.top_k)) {
    return Status::Corrupt(path + ": /tokens/topk_ids shape does not match num_layers/top_k attributes");
  }
  return Status::Ok();
}

// An optional dataset that is present is checked even where it is not read (DESIGN.md §5): the weights' shape.
Status CheckWeightDims(const h5::File& f, const h5::Dims& id_dims, const std::string& path) {
  ELDR_ASSIGN_OR_RETURN(h5::Dims dims, f.Shape("/tokens/topk_weights"));
  if (dims != id_dims) return Status::Corrupt(path + ": /tokens/topk_weights shape differs from topk_ids");
  return Status::Ok();
}

// /requests of a trace file (not validated).
Result<std::vector<TraceRequest>> ReadTraceRequests(const h5::File& f, const std::string& path) {
  // Every request holds a token, so /requests is no longer than /tokens/topk_ids: a corrupt shape that claims more
  // is refused before anything is allocated for it (2^40 declared, unwritten rows: "out of memory" otherwise).
  ELDR_ASSIGN_OR_RETURN(h5::Dims token_dims, f.Shape("/tokens/topk_ids"));
  const hsize_t max_requests = token_dims.empty() ? 0 : token_dims[0];
  for (const char* name :
       {"/requests/id", "/requests/domain", "/requests/prompt_len", "/requests/num_tokens", "/requests/offset"}) {
    ELDR_ASSIGN_OR_RETURN(h5::Dims dims, f.Shape(name));
    if (dims.size() != 1) return Status::Corrupt(path + ": " + name + " must be one-dimensional");
    if (dims[0] > max_requests) {
      return Status::Corrupt(path + ": " + name + " has " + std::to_string(dims[0]) + " requests, more than the " +
                             std::to_string(max_requests) + " tokens of /tokens/topk_ids (corrupt shape)");
    }
  }
  ELDR_ASSIGN_OR_RETURN(auto ids, f.ReadStrings("/requests/id"));
  ELDR_ASSIGN_OR_RETURN(auto domains, f.ReadStrings("/requests/domain"));
  h5::Dims d1;
  ELDR_ASSIGN_OR_RETURN(auto prompt_len, f.Read<int64_t>("/requests/prompt_len", &d1, 1));
  ELDR_ASSIGN_OR_RETURN(auto num_tokens, f.Read<int64_t>("/requests/num_tokens", &d1, 1));
  ELDR_ASSIGN_OR_RETURN(auto offset, f.Read<int64_t>("/requests/offset", &d1, 1));
  const size_t n = ids.size();
  if (domains.size() != n || prompt_len.size() != n || num_tokens.size() != n || offset.size() != n) {
    return Status::Corrupt(path + ": /requests datasets differ in length");
  }
  std::vector<TraceRequest> requests(n);
  for (size_t i = 0; i < n; ++i) {
    requests[i] = TraceRequest{ids[i], domains[i], prompt_len[i], num_tokens[i], offset[i]};
  }
  return requests;
}

}  // namespace

Result<Trace> ReadTrace(const std::string& path) { return ReadTrace(path, TraceReadOptions()); }

Result<Trace> ReadTrace(const std::string& path, const TraceReadOptions& options) {
  ELDR_ASSIGN_OR_RETURN(h5::File f, h5::File::OpenReadOnly(path));
  Trace t;
  ELDR_RETURN_IF_ERROR(ReadTraceShape(f, path, &t.shape));
  const auto read = [&](const std::string& name, auto* out, h5::Dims* dims) -> Status {
    using T = typename std::remove_pointer_t<decltype(out)>::value_type;
    auto r = options.direct_chunks ? f.ReadParallel<T>(name, dims, 3, options.num_threads) : f.Read<T>(name, dims, 3);
    if (!r.ok()) return r.status();
    *out = std::move(r).value();
    return Status::Ok();
  };
  h5::Dims dims;
  ELDR_RETURN_IF_ERROR(read("/tokens/topk_ids", &t.topk_ids, &dims));
  ELDR_RETURN_IF_ERROR(CheckIdDims(dims, t.shape, path));
  // The requests against the ids first: ids cut short are named as such, not as weights of another shape.
  ELDR_ASSIGN_OR_RETURN(t.requests, ReadTraceRequests(f, path));
  ELDR_RETURN_IF_ERROR(ValidateTraceRequests(t.requests, static_cast<int64_t>(dims[0]), path));
  if (options.weights && f.Exists("/tokens/topk_weights")) {
    h5::Dims wdims;
    ELDR_RETURN_IF_ERROR(read("/tokens/topk_weights", &t.topk_weights, &wdims));
    if (wdims != dims) return Status::Corrupt(path + ": /tokens/topk_weights shape differs from topk_ids");
  } else if (f.Exists("/tokens/topk_weights")) {
    ELDR_RETURN_IF_ERROR(CheckWeightDims(f, dims, path));
  }
  ELDR_RETURN_IF_ERROR(ValidateTrace(t, path));
  return t;
}

// ---- TraceStreamReader ----

Result<std::unique_ptr<TraceStreamReader>> TraceStreamReader::Open(const std::string& path) {
  ELDR_ASSIGN_OR_RETURN(h5::File f, h5::File::OpenReadOnly(path));
  std::unique_ptr<TraceStreamReader> r(new TraceStreamReader(path));
  ELDR_RETURN_IF_ERROR(ReadTraceShape(f, path, &r->header_.shape));
  ELDR_ASSIGN_OR_RETURN(h5::Dims dims, f.Shape("/tokens/topk_ids"));
  ELDR_RETURN_IF_ERROR(CheckIdDims(dims, r->header_.shape, path));
  ELDR_ASSIGN_OR_RETURN(r->header_.requests, ReadTraceRequests(f, path));
  r->num_tokens_total_ = static_cast<int64_t>(dims[0]);
  ELDR_RETURN_IF_ERROR(ValidateTraceRequests(r->header_.requests, r->num_tokens_total_, path));
  if (f.Exists("/tokens/topk_weights")) ELDR_RETURN_IF_ERROR(CheckWeightDims(f, dims, path));
  r->file_ = std::make_unique<h5::File>(std::move(f));
  return r;
}

int TraceStreamReader::NumWorkers(const TraceReadOptions& options) {
  return options.num_threads > 0 ? options.num_threads : DefaultThreads();
}

Status TraceStreamReader::ReadIds(const TraceReadOptions& options, const TraceTokenConsumer& consume) {
  const int workers = NumWorkers(options);
  std::vector<IdCheckState> checks(workers);
  // The error of the lowest bad token, the one ValidateTrace reports; blocks after a bad one are not consumed.
  std::mutex mu;
  int64_t first_bad = std::numeric_limits<int64_t>::max();
  Status bad;
  std::atomic<bool> failed{false};
  const TraceShape& shape = header_.shape;
  h5::Dims dims;
  ELDR_RETURN_IF_ERROR(file_->ReadRowBlocks<uint16_t>(
      "/tokens/topk_ids", 3, workers,
      [&](hsize_t first_row, hsize_t num_rows, const uint16_t* ids, int worker) {
        const int64_t first = static_cast<int64_t>(first_row), n = static_cast<int64_t>(num_rows);
        Status st = ValidateTokenIds(ids, n, first, shape, path_, &checks[worker]);
        if (!st.ok()) {
          std::lock_guard<std::mutex> lock(mu);
          if (first < first_bad) {
            first_bad = first;
            bad = std::move(st);
          }
          failed = true;
          return;
        }
        if (!failed) consume(first, n, ids, worker);
      },
      &dims, nullptr, options.direct_chunks));
  ELDR_RETURN_IF_ERROR(CheckIdDims(dims, shape, path_));
  if (static_cast<int64_t>(dims[0]) != num_tokens_total_) {
    return Status::Corrupt(path_ + ": /tokens/topk_ids changed while reading");
  }
  return bad;
}

TraceStreamReader::~TraceStreamReader() = default;

Status WriteTrace(const Trace& trace, const std::string& path, const TraceStorage& storage) {
  ELDR_RETURN_IF_ERROR(ValidateTrace(trace, path));
  ELDR_ASSIGN_OR_RETURN(auto writer, TraceWriter::Open(path, trace.shape, trace.has_weights(), storage));
  for (const auto& r : trace.requests) {
    ELDR_RETURN_IF_ERROR(
        writer->Append(r, trace.token_ids(r.offset), trace.has_weights() ? trace.token_weights(r.offset) : nullptr));
  }
  return writer->Finish();
}

// ---- TraceWriter ----

Result<std::unique_ptr<TraceWriter>> TraceWriter::Open(const std::string& path, const TraceShape& shape,
                                                       bool with_weights, const TraceStorage& storage) {
  ELDR_RETURN_IF_ERROR(ValidateTraceShape(shape.num_layers, shape.num_experts, shape.top_k, path));
  std::unique_ptr<TraceWriter> w(new TraceWriter(path));
  ELDR_RETURN_IF_ERROR(w->out_.CheckWritable());
  ELDR_ASSIGN_OR_RETURN(h5::File f, h5::File::Create(w->out_.temp_path(), path));
  w->file_ = std::make_unique<h5::File>(std::move(f));
  w->shape_ = shape;
  const h5::Dims row{static_cast<hsize_t>(shape.num_layers), static_cast<hsize_t>(shape.top_k)};
  const hsize_t id_row_bytes = row[0] * row[1] * sizeof(uint16_t);
  const hsize_t chunk_rows =
      storage.chunk_rows > 0
          ? static_cast<hsize_t>(storage.chunk_rows)
          : std::max<hsize_t>(1, static_cast<hsize_t>(std::max<int64_t>(storage.chunk_bytes, 1)) / id_row_bytes);
  const h5::Filters filters{storage.shuffle, storage.deflate_level};
  ELDR_ASSIGN_OR_RETURN(h5::Appender ids, h5::Appender::Create(*w->file_, "/tokens/topk_ids", H5T_NATIVE_UINT16, row,
                                                               chunk_rows, filters));
  w->ids_ = std::make_unique<h5::Appender>(std::move(ids));
  if (with_weights) {
    ELDR_ASSIGN_OR_RETURN(h5::Appender ws, h5::Appender::Create(*w->file_, "/tokens/topk_weights", H5T_NATIVE_FLOAT,
                                                                row, chunk_rows, filters));
    w->weights_ = std::make_unique<h5::Appender>(std::move(ws));
  }
  return w;
}

Status TraceWriter::Append(const TraceRequest& request, const uint16_t* ids, const float* weights) {
  if (Interrupted()) return InterruptStatus().WithPrefix(out_.path());
  if (weights_) {  // what ReadTrace would reject is not written
    const size_t row = static_cast<size_t>(shape_.num_layers) * shape_.top_k;
    ELDR_RETURN_IF_ERROR(
        ValidateTopkWeights(weights, static_cast<size_t>(request.num_tokens) * row, row, num_tokens_, out_.path()));
  }
  TraceRequest r = request;
  r.offset = num_tokens_;
  ELDR_RETURN_IF_ERROR(ids_->Append(ids, r.num_tokens));
  if (weights_) ELDR_RETURN_IF_ERROR(weights_->Append(weights, r.num_tokens));
  num_tokens_ += r.num_tokens;
  requests_.push_back(std::move(r));
  return Status::Ok();
}

Status TraceWriter::Finish() {
  h5::File& f = *file_;
  const size_t n = requests_.size();
  std::vector<std::string> ids(n), domains(n);
  std::vector<int64_t> prompt_len(n), num_tokens(n), offset(n);
  for (size_t i = 0; i < n; ++i) {
    ids[i] = requests_[i].id;
    domains[i] = requests_[i].domain;
    prompt_len[i] = requests_[i].prompt_len;
    num_tokens[i] = requests_[i].num_tokens;
    offset[i] = requests_[i].offset;
  }
  ELDR_RETURN_IF_ERROR(f.WriteAttribute("/", "format", std::string("eldr-trace")));
  ELDR_RETURN_IF_ERROR(f.WriteAttribute("/", "format_version", kTraceFormatVersion));
  ELDR_RETURN_IF_ERROR(f.WriteAttribute("/", "model", shape_.model));
  ELDR_RETURN_IF_ERROR(f.WriteAttribute("/", "num_layers", static_cast<int64_t>(shape_.num_layers)));
  ELDR_RETURN_IF_ERROR(f.WriteAttribute("/", "num_experts", static_cast<int64_t>(shape_.num_experts)));
  ELDR_RETURN_IF_ERROR(f.WriteAttribute("/", "top_k", static_cast<int64_t>(shape_.top_k)));
  ELDR_RETURN_IF_ERROR(f.WriteStrings("/requests/id", ids));
  ELDR_RETURN_IF_ERROR(f.WriteStrings("/requests/domain", domains));
  ELDR_RETURN_IF_ERROR(f.Write("/requests/prompt_len", prompt_len, {n}));
  ELDR_RETURN_IF_ERROR(f.Write("/requests/num_tokens", num_tokens, {n}));
  ELDR_RETURN_IF_ERROR(f.Write("/requests/offset", offset, {n}));
  // A fixed order: the datasets (whose closes flush their last chunks), then the file, then the rename.
  Status st = ids_->Close();
  if (weights_) {
    Status w = weights_->Close();
    if (st.ok()) st = w;
  }
  ids_.reset();
  weights_.reset();
  Status closed = f.Close();
  if (st.ok()) st = closed;
  file_.reset();
  ELDR_RETURN_IF_ERROR(st);
  return out_.Commit();
}

}  // namespace eldr
