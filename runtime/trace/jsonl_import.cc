// JSONL → HDF5 trace import (DESIGN.md §5). Streams the input line by line (gzip or plain, through
// zlib), validates each request fully and appends it; the first bad line aborts the import.
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

// Reads lines of any length from a plain or gzip file.
class LineReader {
 public:
  explicit LineReader(gzFile f) : f_(f), buf_(1 << 20) {}
  // Returns false at end of file; sets *error on a read error.
  bool Next(std::string* line, bool* error) {
    line->clear();
    while (true) {
      if (pos_ == len_) {
        int n = gzread(f_, buf_.data(), static_cast<unsigned>(buf_.size()));
        if (n < 0) {
          *error = true;
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
  // The last line returned ended at the end of the input, without a newline.
  bool unterminated() const { return unterminated_; }

 private:
  gzFile f_;
  std::vector<char> buf_;
  size_t pos_ = 0, len_ = 0;
  bool unterminated_ = false;
};

// zlib reports a stream cut short as a clean end of input with Z_BUF_ERROR pending.
bool GzStreamCutShort(gzFile gz) {
  int err = Z_OK;
  gzerror(gz, &err);
  return err != Z_OK && err != Z_STREAM_END;
}

// zlib's gzread ends quietly at bytes after a gzip member that are not another member (something appended to a .gz
// file), dropping them. So a gzip input that is a regular file is inflated once more, output discarded, member by
// member: 0 when every byte belongs to a member, else how many bytes follow the last one. (This second pass costs
// less than the first one's JSON parsing; a pipe cannot be read twice and is not checked.)
Result<uint64_t> BytesAfterGzipMembers(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return Status::IoError(path + ": cannot reopen: " + std::strerror(errno));
  z_stream z{};
  if (inflateInit2(&z, 15 + 16) != Z_OK) {
    std::fclose(f);
    return Status::IoError(path + ": cannot inflate: out of memory");
  }
  struct Closer {
    std::FILE* f;
    z_stream* z;
    ~Closer() {
      inflateEnd(z);
      std::fclose(f);
    }
  } closer{f, &z};
  std::vector<unsigned char> in(1 << 18), out(1 << 18);
  bool eof = false, member_start = true;
  while (true) {
    if (z.avail_in < 2 && !eof) {  // refill, keeping what is left (a gzip magic may straddle two reads)
      if (z.avail_in > 0) std::memmove(in.data(), z.next_in, z.avail_in);
      const size_t n = std::fread(in.data() + z.avail_in, 1, in.size() - z.avail_in, f);
      if (n == 0) eof = true;
      z.next_in = in.data();
      z.avail_in += static_cast<uInt>(n);
    }
    if (z.avail_in == 0) return uint64_t{0};  // every byte was a member's
    if (member_start) {
      if (z.avail_in < 2 || z.next_in[0] != 0x1f || z.next_in[1] != 0x8b) {
        uint64_t rest = z.avail_in;  // not a member: the bytes from here on, counted to the end
        for (size_t n; (n = std::fread(in.data(), 1, in.size(), f)) > 0;) rest += n;
        return rest;
      }
      member_start = false;
    }
    z.next_out = out.data();
    z.avail_out = static_cast<uInt>(out.size());
    const uInt before = z.avail_in;
    const int rc = inflate(&z, Z_NO_FLUSH);
    if (rc == Z_STREAM_END) {
      member_start = true;
      if (inflateReset(&z) != Z_OK) return Status::IoError(path + ": cannot inflate");
    } else if (rc == Z_BUF_ERROR && eof && z.avail_in == before) {
      return uint64_t{0};  // a stream cut short: the first pass has reported it
    } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
      return Status::IoError(path + ": the gzip data is damaged (" + (z.msg ? z.msg : "inflate error") + ")");
    }
  }
}

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
  gzFile gz = gzdopen(fd, "rb");  // owns fd from here
  if (!gz) {
    ::close(fd);
    return Status::IoError(in_path + ": cannot open: out of memory");
  }
  struct GzCloser {
    gzFile f;
    ~GzCloser() { gzclose(f); }
  } closer{gz};
  gzbuffer(gz, 1 << 20);
  LineReader reader(gz);

  std::unique_ptr<TraceWriter> writer;
  TraceShape shape;
  bool with_weights = false;
  std::unordered_set<std::string> ids;
  std::string line;
  bool read_error = false;
  int64_t line_no = 0;
  ParsedRequest req;
  std::error_code ec;
  const auto file_size = std::filesystem::file_size(in_path, ec);
  ProgressBar progress("importing " + std::filesystem::path(in_path).filename().string(),
                       ec ? 0 : static_cast<int64_t>(file_size));
  while (reader.Next(&line, &read_error)) {
    if (Interrupted()) return InterruptStatus().WithPrefix(out_path);
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank line
    Status st = ParseLine(line, &req);
    if (!st.ok() && reader.unterminated() && GzStreamCutShort(gz)) {
      // The last line is cut, not malformed: say so instead of reporting its JSON.
      return Status::IoError(in_path + ":" + std::to_string(line_no) +
                             ": the gzip stream ends early (the file is truncated): " + gzerror(gz, nullptr));
    }
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
    progress.Update(static_cast<int64_t>(gzoffset(gz)));
  }
  progress.Finish();
  if (GzStreamCutShort(gz)) read_error = true;
  if (read_error) {
    int errnum = 0;
    const char* msg = gzerror(gz, &errnum);
    return Status::IoError(in_path + ":" + std::to_string(line_no + 1) + ": read error: " + (msg ? msg : "unknown") +
                           " (truncated gzip?)");
  }
  // Every byte of a gzip file is read, or the file is refused (concatenated members are one stream, read whole).
  if (!gzdirect(gz) && !ec && std::filesystem::is_regular_file(in_path, ec)) {
    ELDR_ASSIGN_OR_RETURN(const uint64_t after, BytesAfterGzipMembers(in_path));
    if (after > 0) {
      return Status::InvalidArgument(in_path + ": " + std::to_string(after) + (after == 1 ? " byte" : " bytes") +
                                     " after the end of the gzip stream are not gzip data (appended to the file?): "
                                     "remove them, or compress the whole file again");
    }
  }
  if (!writer) return Status::InvalidArgument(in_path + ": no requests (the file is empty)");
  if (summary) {
    summary->num_requests = writer->num_requests();
    summary->num_tokens = writer->num_tokens();
    summary->shape = shape;
    summary->has_weights = with_weights;
  }
  return writer->Finish();
}

}  // namespace eldr
