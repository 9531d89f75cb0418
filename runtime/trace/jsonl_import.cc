// JSONL → HDF5 trace import (DESIGN.md §5). Streams the input line by line (gzip or plain, through
// zlib), validates each request fully and appends it; the first bad line aborts the import.
#include <poll.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <unordered_set>
#include <utility>

#include "runtime/common/atomic_file.h"
#include "runtime/common/json_util.h"
#include "runtime/common/memory_budget.h"
#include "runtime/common/progress.h"
#include "runtime/common/signals.h"
#include "runtime/common/yaml.h"
#include "runtime/trace/trace.h"
#include "runtime/trace/trace_store.h"

namespace eldr {

namespace {

using nlohmann::json;

// The content of a plain or gzip input (a regular file or a pipe), read once. A gzip input is inflated member by
// member, concatenated members being one stream as gunzip reads them. Bytes after the last member that do not
// start another (something appended to a .gz file) are counted and refused, a member cut short is reported as
// truncated and damaged data as damaged. (zlib's gzread ends quietly at appended bytes, and a pipe cannot be read
// a second time to find them.)
class InputBytes {
 public:
  // Takes ownership of `fd`. `path` names the input in errors.
  InputBytes(int fd, std::string path) : fd_(fd), path_(std::move(path)), in_(1 << 18) {}
  ~InputBytes() {
    if (inflating_) inflateEnd(&z_);
    ::close(fd_);
  }
  InputBytes(const InputBytes&) = delete;
  InputBytes& operator=(const InputBytes&) = delete;

  // Reads up to `cap` bytes of content into `out`: the count, 0 at the end of the input, -1 on an error (status()).
  int64_t Read(char* out, size_t cap) {
    if (!status_.ok()) return -1;
    if (mode_ == Mode::kUnknown && !Start()) return -1;
    if (mode_ == Mode::kPlain) {
      if (avail_ == 0 && !Fill()) return status_.ok() ? 0 : -1;
      const size_t n = std::min(cap, avail_);
      std::memcpy(out, next_, n);
      next_ += n;
      avail_ -= n;
      return static_cast<int64_t>(n);
    }
    while (true) {
      if (member_start_) {
        while (avail_ < 2 && Fill()) {  // a pipe may hand over the next member's magic one byte at a time
        }
        if (!status_.ok()) return -1;
        if (avail_ == 0) return 0;  // the end, at a member boundary
        if (avail_ < 2 || next_[0] != 0x1f || static_cast<unsigned char>(next_[1]) != 0x8b) return Trailing();
        member_start_ = false;
      }
      if (avail_ == 0 && !Fill()) {
        if (!status_.ok()) return -1;
        status_ = Status::IoError(path_ + ": the gzip stream ends early (the file is truncated)");
        truncated_ = true;
        return -1;
      }
      z_.next_in = reinterpret_cast<Bytef*>(next_);
      z_.avail_in = static_cast<uInt>(std::min<size_t>(avail_, std::numeric_limits<uInt>::max()));
      z_.next_out = reinterpret_cast<Bytef*>(out);
      z_.avail_out = static_cast<uInt>(std::min<size_t>(cap, std::numeric_limits<uInt>::max()));
      const uInt in_before = z_.avail_in, out_before = z_.avail_out;
      const int rc = inflate(&z_, Z_NO_FLUSH);
      next_ += in_before - z_.avail_in;
      avail_ -= in_before - z_.avail_in;
      const int64_t produced = out_before - z_.avail_out;
      if (rc == Z_STREAM_END) {
        member_start_ = true;
        if (inflateReset(&z_) != Z_OK) return Fail("cannot inflate");
      } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
        return Fail(std::string("the gzip data is damaged (") + (z_.msg ? z_.msg : "inflate error") + ")");
      }
      if (produced > 0) return produced;
      // Z_BUF_ERROR with nothing produced: inflate needs more input (the loop reads it, or reports the cut).
    }
  }

  const Status& status() const { return status_; }
  bool truncated() const { return truncated_; }
  uint64_t bytes_read() const { return bytes_read_; }  // of the input as stored (compressed), for progress

 private:
  enum class Mode { kUnknown, kPlain, kGzip };

  // Reads more of the input after the bytes not yet used. False at its end or on an error (status_). The read
  // waits in poll() with a timeout, so that a signal ends an import whose pipe writer has gone quiet (the handlers
  // restart a blocked read: SA_RESTART).
  bool Fill() {
    if (eof_) return false;
    if (avail_ > 0 && next_ != in_.data()) std::memmove(in_.data(), next_, avail_);
    next_ = in_.data();
    while (true) {
      if (Interrupted()) {
        status_ = InterruptStatus();
        return false;
      }
      struct pollfd p = {fd_, POLLIN, 0};
      const int ready = ::poll(&p, 1, 200);
      if (ready == 0 || (ready < 0 && errno == EINTR)) continue;
      const ssize_t n = ::read(fd_, in_.data() + avail_, in_.size() - avail_);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        status_ = Status::IoError(path_ + ": read error: " + std::strerror(errno));
        return false;
      }
      if (n == 0) eof_ = true;
      avail_ += static_cast<size_t>(n);
      bytes_read_ += static_cast<uint64_t>(n);
      return n > 0;
    }
  }

  // The first bytes tell gzip (1f 8b) from plain text.
  bool Start() {
    while (avail_ < 2 && Fill()) {
    }
    if (!status_.ok()) return false;
    const bool gzip = avail_ >= 2 && next_[0] == 0x1f && static_cast<unsigned char>(next_[1]) == 0x8b;
    mode_ = gzip ? Mode::kGzip : Mode::kPlain;
    if (gzip) {
      if (inflateInit2(&z_, 15 + 16) != Z_OK) {
        Fail("cannot inflate: out of memory");
        return false;
      }
      inflating_ = true;
    }
    return true;
  }

  // Bytes after the last member: counted to the end of the input, then refused, unless they are all zero (the
  // padding of a block device or tape, which gunzip ignores too).
  int64_t Trailing() {
    uint64_t rest = 0;
    bool zeros = true;
    do {
      zeros = zeros && std::all_of(next_, next_ + avail_, [](char c) { return c == 0; });
      rest += avail_;
      avail_ = 0;
    } while (Fill());
    if (!status_.ok()) return -1;
    if (zeros) return 0;
    status_ = Status::InvalidArgument(path_ + ": " + std::to_string(rest) + (rest == 1 ? " byte" : " bytes") +
                                      " after the end of the gzip stream are not gzip data (appended to the file?): "
                                      "remove them, or compress the whole file again");
    return -1;
  }

  int64_t Fail(const std::string& what) {
    status_ = Status::IoError(path_ + ": " + what);
    return -1;
  }

  int fd_;
  std::string path_;
  std::vector<char> in_;
  char* next_ = nullptr;  // the bytes of in_ not used yet: [next_, next_ + avail_)
  size_t avail_ = 0;
  bool eof_ = false;
  uint64_t bytes_read_ = 0;
  Mode mode_ = Mode::kUnknown;
  z_stream z_{};
  bool inflating_ = false, member_start_ = true, truncated_ = false;
  Status status_;
};

// Reads lines of any length from an InputBytes.
class LineReader {
 public:
  explicit LineReader(InputBytes* in) : in_(in), buf_(1 << 20) {}
  // Returns false at the end of the input or on an error (in->status()).
  bool Next(std::string* line) {
    line->clear();
    while (true) {
      if (pos_ == len_) {
        const int64_t n = in_->Read(buf_.data(), buf_.size());
        if (n < 0) {
          cut_line_ = !line->empty();
          return false;
        }
        if (n == 0) {
          unterminated_ = !line->empty();
          return unterminated_;
        }
        pos_ = 0;
        len_ = static_cast<size_t>(n);
      }
      const char* start = buf_.data() + pos_;
      const void* nl = std::memchr(start, '\n', len_ - pos_);
      if (nl) {
        size_t take = static_cast<const char*>(nl) - start;
        line->append(start, take);
        pos_ += take + 1;
        return true;
      }
      line->append(start, len_ - pos_);
      pos_ = len_;
    }
  }
  // Next() returned false on an error with part of a line read (the error cut that line).
  bool cut_line() const { return cut_line_; }

 private:
  InputBytes* in_;
  std::vector<char> buf_;
  size_t pos_ = 0, len_ = 0;
  bool unterminated_ = false, cut_line_ = false;
};

struct ParsedRequest {
  TraceRequest meta;
  TraceShape shape;
  std::vector<uint16_t> ids;   // [T, L, k]
  std::vector<float> weights;  // [T, L, k] or empty
};

// Every field of a record (DESIGN.md §5), in the order the format lists them. Anything else is refused: a
// misspelt optional field ("domian") would otherwise import the request without it.
const std::vector<std::string>& RecordFields() {
  static const std::vector<std::string> fields = {"id",    "domain",     "model",      "num_layers", "num_experts",
                                                  "top_k", "num_tokens", "prompt_len", "topk_ids",   "topk_weights"};
  return fields;
}

// InvalidArgument "unknown field 'domian' (did you mean 'domain'?); a record's fields are id, ..." for the first
// field of `j` (in key order) that the format does not have.
Status CheckRecordFields(const json& j) {
  const std::vector<std::string>& fields = RecordFields();
  for (const auto& [key, value] : j.items()) {
    if (std::find(fields.begin(), fields.end(), key) != fields.end()) continue;
    const std::string near = NearestWord(key, fields);
    std::string list;
    for (const std::string& f : fields) list += (list.empty() ? "" : ", ") + f;
    return Status::InvalidArgument("unknown field '" + key + "'" +
                                   (near.empty() ? "" : " (did you mean '" + near + "'?)") +
                                   "; a record's fields are " + list + " (DESIGN.md §5)");
  }
  return Status::Ok();
}

// Parses and validates one line. Errors are the problem only; the caller adds file and line.
Status ParseLine(const std::string& line, ParsedRequest* out) {
  // JSON text has no raw NUL byte (inside a string it is \u0000); the parser would stop at one and drop the rest.
  if (const size_t nul = line.find('\0'); nul != std::string::npos) {
    return Status::InvalidArgument("a NUL byte at column " + std::to_string(nul + 1) + " (not JSON text)");
  }
  ELDR_ASSIGN_OR_RETURN(json j, ParseJson(line));
  if (!j.is_object()) return Status::InvalidArgument("a line must be a JSON object");
  ELDR_RETURN_IF_ERROR(CheckRecordFields(j));
  auto get_int = [&](const char* key, int64_t* v, bool required) -> Status {
    auto it = j.find(key);
    if (it == j.end()) {
      return required ? Status::InvalidArgument(std::string("missing field '") + key + "'") : Status::Ok();
    }
    if (!it->is_number_integer()) return Status::InvalidArgument(std::string("field '") + key + "' must be an integer");
    // An unsigned value above 2^63 - 1 would wrap to a negative one (and be refused as such, misnamed).
    if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Status::InvalidArgument(std::string("field '") + key + "' = " + it->dump() + " is out of range");
    }
    *v = it->get<int64_t>();
    return Status::Ok();
  };
  auto it = j.find("id");
  if (it == j.end()) return Status::InvalidArgument("missing field 'id'");
  if (it->is_string()) {
    out->meta.id = it->get<std::string>();
  } else if (it->is_number_integer()) {
    out->meta.id = std::to_string(it->get<int64_t>());
  } else {
    return Status::InvalidArgument("field 'id' must be a string or an integer");
  }
  if (out->meta.id.empty()) return Status::InvalidArgument("field 'id' is empty");
  out->meta.domain.clear();
  if ((it = j.find("domain")) != j.end() && !it->is_null()) {
    if (!it->is_string()) return Status::InvalidArgument("field 'domain' must be a string");
    out->meta.domain = it->get<std::string>();
    if (out->meta.domain.empty()) {
      return Status::InvalidArgument("field 'domain' is an empty string (omit the field when there is no label)");
    }
  }
  out->shape.model.clear();
  if ((it = j.find("model")) != j.end() && !it->is_null()) {
    if (!it->is_string()) return Status::InvalidArgument("field 'model' must be a string");
    out->shape.model = it->get<std::string>();
  }
  // HDF5 strings end at a NUL: "a\u0000b" would be stored as "a" (another request's id, or another label).
  for (const auto& [key, text] : {std::pair<const char*, const std::string*>{"id", &out->meta.id},
                                  {"domain", &out->meta.domain},
                                  {"model", &out->shape.model}}) {
    if (text->find('\0') != std::string::npos) {
      return Status::InvalidArgument(std::string("field '") + key + "' contains a NUL character (\\u0000)");
    }
  }
  int64_t L = 0, E = 0, K = 0, T = 0, P = 0;
  ELDR_RETURN_IF_ERROR(get_int("num_layers", &L, true));
  ELDR_RETURN_IF_ERROR(get_int("num_experts", &E, true));
  ELDR_RETURN_IF_ERROR(get_int("top_k", &K, true));
  ELDR_RETURN_IF_ERROR(get_int("num_tokens", &T, true));
  ELDR_RETURN_IF_ERROR(get_int("prompt_len", &P, true));
  {
    const Status shape = ValidateTraceShape(L, E, K, "");
    if (!shape.ok()) return Status::InvalidArgument(shape.message().substr(2));  // the caller adds FILE:LINE
  }
  if (T <= 0) return Status::InvalidArgument("num_tokens must be positive");
  if (P < 0 || P > T) {
    return Status::InvalidArgument("prompt_len " + std::to_string(P) +
                                   " must be in [0, num_tokens = " + std::to_string(T) + "]");
  }
  if (T > kMaxRequestEntries / (L * K)) {
    return Status::InvalidArgument("a request of " + std::to_string(T) + " tokens x " + std::to_string(L) +
                                   " layers x top-" + std::to_string(K) + " is larger than one request may be (" +
                                   std::to_string(kMaxRequestEntries) + " routing entries)");
  }
  out->shape.num_layers = static_cast<int>(L);
  out->shape.num_experts = static_cast<int>(E);
  out->shape.top_k = static_cast<int>(K);
  out->meta.num_tokens = T;
  out->meta.prompt_len = P;

  auto ids_it = j.find("topk_ids");
  if (ids_it == j.end()) return Status::InvalidArgument("missing field 'topk_ids'");
  if (!ids_it->is_array() || static_cast<int64_t>(ids_it->size()) != T) {
    return Status::InvalidArgument("topk_ids must have num_tokens = " + std::to_string(T) + " entries, has " +
                                   std::to_string(ids_it->is_array() ? ids_it->size() : 0));
  }
  const json* w = nullptr;
  if ((it = j.find("topk_weights")) != j.end() && !it->is_null()) {
    w = &*it;
    if (!w->is_array() || static_cast<int64_t>(w->size()) != T) {
      return Status::InvalidArgument("topk_weights must have the shape of topk_ids");
    }
  }
  ELDR_RETURN_IF_ERROR(CheckMemoryBudget(
      static_cast<double>(T) * L * K * (w ? 6 : 2),
      "num_tokens " + std::to_string(T) + " x " + std::to_string(L) + " layers x top-" + std::to_string(K)));
  out->ids.assign(static_cast<size_t>(T * L * K), 0);
  out->weights.assign(w ? static_cast<size_t>(T * L * K) : 0, 0.f);
  std::vector<int64_t> seen(E, -1);
  int64_t stamp = 0;
  for (int64_t t = 0; t < T; ++t) {
    const json& tok = (*ids_it)[t];
    if (!tok.is_array() || static_cast<int64_t>(tok.size()) != L) {
      return Status::InvalidArgument("topk_ids[" + std::to_string(t) + "] must have num_layers = " + std::to_string(L) +
                                     " entries");
    }
    for (int64_t l = 0; l < L; ++l, ++stamp) {
      const json& sel = tok[l];
      const std::string where = "topk_ids[" + std::to_string(t) + "][" + std::to_string(l) + "]";
      if (!sel.is_array() || static_cast<int64_t>(sel.size()) != K) {
        return Status::InvalidArgument(where + " must have top_k = " + std::to_string(K) + " ids");
      }
      for (int64_t m = 0; m < K; ++m) {
        if (!sel[m].is_number_integer()) return Status::InvalidArgument(where + " has a non-integer id");
        int64_t e = sel[m].get<int64_t>();
        if (e < 0 || e >= E) {
          return Status::InvalidArgument(where + " has expert id " + std::to_string(e) +
                                         " outside [0, num_experts = " + std::to_string(E) + ")");
        }
        if (seen[e] == stamp) {
          return Status::InvalidArgument(where + " repeats expert " + std::to_string(e) +
                                         " (top-k ids must be distinct)");
        }
        seen[e] = stamp;
        out->ids[(t * L + l) * K + m] = static_cast<uint16_t>(e);
      }
      if (w) {
        const json& wt = (*w)[t];
        if (!wt.is_array() || static_cast<int64_t>(wt.size()) != L || !wt[l].is_array() ||
            static_cast<int64_t>(wt[l].size()) != K) {
          return Status::InvalidArgument("topk_weights[" + std::to_string(t) + "] must have the shape of topk_ids");
        }
        for (int64_t m = 0; m < K; ++m) {
          const json& v = wt[l][m];
          if (!v.is_number()) return Status::InvalidArgument("topk_weights has a non-number value");
          double x = v.get<double>();
          // As a float (the trace stores float32): 1e39 overflows to inf, which every reader rejects.
          if (!std::isfinite(x) || x < 0 || x > std::numeric_limits<float>::max()) {
            return Status::InvalidArgument("topk_weights[" + std::to_string(t) + "][" + std::to_string(l) +
                                           "] has a negative or non-finite value (or one beyond float32's 3.4e38)");
          }
          out->weights[(t * L + l) * K + m] = static_cast<float>(x);
        }
      }
    }
  }
  return Status::Ok();
}

}  // namespace

Status ImportJsonlTrace(const std::string& in_path, const std::string& out_path, ImportSummary* summary) {
  // Before reading a line: an output that is the input would destroy it, a bad path would fail after the work.
  ELDR_RETURN_IF_ERROR(CheckOutputs({{out_path, "--out"}}, {{in_path, "--in"}}));
  int fd = -1;
  ELDR_RETURN_IF_ERROR(OpenInputStream(in_path, "a JSONL trace", &fd));
  InputBytes input(fd, in_path);  // owns fd from here
  LineReader reader(&input);

  std::unique_ptr<TraceWriter> writer;
  TraceShape shape;
  bool with_weights = false;
  std::unordered_set<std::string> ids;
  std::string line;
  int64_t line_no = 0;
  ParsedRequest req;
  std::error_code ec;
  const auto file_size = std::filesystem::file_size(in_path, ec);
  ProgressBar progress("importing " + std::filesystem::path(in_path).filename().string(),
                       ec ? 0 : static_cast<int64_t>(file_size));
  while (reader.Next(&line)) {
    if (Interrupted()) return InterruptStatus().WithPrefix(out_path);
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank line
    Status st = ParseLine(line, &req);
    if (!st.ok()) return Status::InvalidArgument(in_path + ":" + std::to_string(line_no) + ": " + st.message());
    const std::string where = in_path + ":" + std::to_string(line_no) + ": ";
    if (!writer) {
      shape = req.shape;
      with_weights = !req.weights.empty();
      ELDR_ASSIGN_OR_RETURN(writer, TraceWriter::Open(out_path, shape, with_weights));
    } else {
      if (!req.shape.SameAs(shape)) {
        return Status::InvalidArgument(where + "shape " + req.shape.ToString() + " differs from the first request's " +
                                       shape.ToString());
      }
      // One trace, one model: the file stores the first line's name.
      if (!req.shape.model.empty() && !shape.model.empty() && req.shape.model != shape.model) {
        return Status::InvalidArgument(where + "model '" + req.shape.model + "' differs from the first request's '" +
                                       shape.model + "'");
      }
      if (with_weights != !req.weights.empty()) {
        return Status::InvalidArgument(where + (with_weights ? "has no topk_weights but earlier lines do"
                                                             : "has topk_weights but earlier lines do not"));
      }
    }
    if (!ids.insert(req.meta.id).second) {
      return Status::InvalidArgument(where + "duplicate request id '" + req.meta.id + "'");
    }
    ELDR_RETURN_IF_ERROR(writer->Append(req.meta, req.ids.data(), with_weights ? req.weights.data() : nullptr));
    progress.Update(static_cast<int64_t>(input.bytes_read()));
  }
  // A line cut by the end of a gzip member that ends early is not parsed: the truncation is reported, naming the
  // line it cut (a read error, appended bytes or damaged data name the input).
  if (!input.status().ok()) {
    if (Interrupted()) return InterruptStatus().WithPrefix(out_path);
    if (input.truncated()) {  // naming the line it cut, or the last whole line when it cut none
      if (reader.cut_line()) {
        return Status::IoError(in_path + ":" + std::to_string(line_no + 1) +
                               ": the gzip stream ends early (the file is truncated)");
      }
      return Status::IoError(in_path + ": the gzip stream ends early after line " + std::to_string(line_no) +
                             " (the file is truncated)");
    }
    return input.status();
  }
  if (!writer) return Status::InvalidArgument(in_path + ": no requests (the file is empty)");
  progress.Finish();
  if (summary) {
    summary->num_requests = writer->num_requests();
    summary->num_tokens = writer->num_tokens();
    summary->shape = shape;
    summary->has_weights = with_weights;
  }
  return writer->Finish();
}

}  // namespace eldr
