#include "runtime/signature/signature.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>

#include "runtime/common/memory_budget.h"
#include "runtime/common/parallel.h"
#include "runtime/trace/trace_store.h"

namespace eldr {

const char* SignatureVariantName(SignatureVariant v) {
  switch (v) {
    case SignatureVariant::kCount:
      return "count";
    case SignatureVariant::kCountIdf:
      return "count_idf";
    case SignatureVariant::kSqrt:
      return "sqrt";
    case SignatureVariant::kBinary:
      return "binary";
    case SignatureVariant::kGateProb:
      return "gate_prob";
  }
  return "unknown";
}

std::vector<SignatureVariant> AllSignatureVariants() {
  return {SignatureVariant::kCount, SignatureVariant::kCountIdf, SignatureVariant::kSqrt, SignatureVariant::kBinary,
          SignatureVariant::kGateProb};
}

Result<SignatureVariant> ParseSignatureVariant(const std::string& name) {
  for (auto v : AllSignatureVariants()) {
    if (name == SignatureVariantName(v)) return v;
  }
  return Status::InvalidArgument("unknown signature variant '" + name +
                                 "' (expected count_idf, count, sqrt, binary or gate_prob)");
}

RequestFeatures ComputeRequestFeatures(const Trace& trace, const std::vector<int32_t>& request_indices) {
  RequestFeatures f;
  const int L = trace.shape.num_layers, E = trace.shape.num_experts, K = trace.shape.top_k;
  f.num_requests = static_cast<int>(request_indices.size());
  f.num_layers = L;
  f.num_experts = E;
  f.request_index = request_indices;
  const size_t row = f.row_size();
  f.prefill_counts.assign(row * f.num_requests, 0.f);
  f.decode_profile.assign(row * f.num_requests, 0.f);
  f.decode_tokens.assign(f.num_requests, 0);
  if (trace.has_weights()) f.gate_sums.assign(row * f.num_requests, 0.f);
  // Each request fills its own rows in token order, so the threads change neither a sum nor its order.
  int64_t work = 0;
  for (int32_t r : request_indices) work += trace.requests[r].num_tokens * L * K;
  ParallelFor(
      f.num_requests,
      [&](int64_t i) {
        const TraceRequest& r = trace.requests[request_indices[i]];
        float* counts = f.prefill_counts.data() + i * row;
        float* gates = trace.has_weights() ? f.gate_sums.data() + i * row : nullptr;
        float* decode = f.decode_profile.data() + i * row;
        for (int64_t t = 0; t < r.num_tokens; ++t) {
          const int64_t g = r.offset + t;
          const uint16_t* ids = trace.token_ids(g);
          const bool prefill = t < r.prompt_len;
          float* dst = prefill ? counts : decode;
          for (int l = 0; l < L; ++l) {
            for (int j = 0; j < K; ++j) dst[l * E + ids[l * K + j]] += 1.f;
          }
          if (prefill && gates) {
            const float* w = trace.token_weights(g);
            for (int l = 0; l < L; ++l) {
              for (int j = 0; j < K; ++j) gates[l * E + ids[l * K + j]] += w[l * K + j];
            }
          }
        }
        f.decode_tokens[i] = r.decode_len();
        if (r.decode_len() > 0) {
          const float inv = 1.f / static_cast<float>(r.decode_len());
          for (size_t x = 0; x < row; ++x) decode[x] *= inv;
        }
      },
      ThreadsFor(work));
  return f;
}

namespace {

// Adds 1 to dst[ℓ·E + e] for every id e of tokens ids [num_tokens, L, k].
void CountIds(const uint16_t* ids, int64_t num_tokens, int L, int E, int K, float* dst) {
  for (int64_t t = 0; t < num_tokens; ++t, ids += static_cast<size_t>(L) * K) {
    for (int l = 0; l < L; ++l) {
      for (int j = 0; j < K; ++j) dst[l * E + ids[l * K + j]] += 1.f;
    }
  }
}

TraceCounts EmptyCounts(const Trace& header, bool with_weights) {
  TraceCounts c;
  c.shape = header.shape;
  c.requests = header.requests;
  c.has_weights = with_weights;
  const size_t n = c.row_size() * c.requests.size();
  c.prefill_counts.assign(n, 0.f);
  c.decode_counts.assign(n, 0.f);
  if (with_weights) c.gate_sums.assign(n, 0.f);
  return c;
}

constexpr int64_t kMaxExactCountTokens = int64_t{1} << 24;  // float holds every whole number up to here

// Counts the blocks ReadIds hands out into `c`: a request inside the block directly into its rows, a piece of a
// request split over blocks into the worker's rows first, then added to the request's rows under its lock.
class BlockCounter {
 public:
  BlockCounter(TraceCounts* c, int num_workers) : c_(*c), partial_(num_workers), locks_(64) {
    offsets_.reserve(c_.requests.size());
    for (const TraceRequest& r : c_.requests) offsets_.push_back(r.offset);
  }

  void Count(int64_t first_token, int64_t num_tokens, const uint16_t* ids, int worker) {
    const int L = c_.shape.num_layers, E = c_.shape.num_experts, K = c_.shape.top_k;
    const size_t row = c_.row_size(), stride = static_cast<size_t>(L) * K;
    size_t r = std::upper_bound(offsets_.begin(), offsets_.end(), first_token) - offsets_.begin() - 1;
    const int64_t end = first_token + num_tokens;
    for (int64_t t = first_token; t < end; ++r) {
      const TraceRequest& q = c_.requests[r];
      const int64_t piece_end = std::min(end, q.offset + q.num_tokens), prompt_end = q.offset + q.prompt_len;
      const int64_t prefill_end = std::clamp(prompt_end, t, piece_end);
      const bool whole = t == q.offset && piece_end == q.offset + q.num_tokens;
      Partial& p = partial_[worker];
      float* pre = c_.prefill_counts.data() + r * row;
      float* dec = c_.decode_counts.data() + r * row;
      if (!whole) {
        p.prefill.assign(row, 0.f);
        p.decode.assign(row, 0.f);
        pre = p.prefill.data();
        dec = p.decode.data();
      }
      const uint16_t* at = ids + static_cast<size_t>(t - first_token) * stride;
      CountIds(at, prefill_end - t, L, E, K, pre);
      CountIds(at + static_cast<size_t>(prefill_end - t) * stride, piece_end - prefill_end, L, E, K, dec);
      if (!whole) AddPiece(r, prefill_end > t, piece_end > prefill_end, p);
      t = piece_end;
    }
  }

 private:
  struct Partial {
    std::vector<float> prefill, decode;  // [L, E]
  };
  void AddPiece(size_t r, bool has_prefill, bool has_decode, const Partial& p) {
    const size_t row = c_.row_size();
    std::lock_guard<std::mutex> lock(locks_[r % locks_.size()]);
    if (has_prefill) Add(p.prefill.data(), c_.prefill_counts.data() + r * row, row);
    if (has_decode) Add(p.decode.data(), c_.decode_counts.data() + r * row, row);
  }
  static void Add(const float* src, float* dst, size_t n) {
    for (size_t x = 0; x < n; ++x) dst[x] += src[x];
  }

  TraceCounts& c_;
  std::vector<int64_t> offsets_;  // [R] first token of each request
  std::vector<Partial> partial_;  // [workers]
  std::vector<std::mutex> locks_;
};

}  // namespace

TraceCounts CountTrace(const Trace& trace) {
  TraceCounts c = EmptyCounts(trace, trace.has_weights());
  const int L = trace.shape.num_layers, E = trace.shape.num_experts, K = trace.shape.top_k;
  const size_t row = c.row_size();
  ParallelFor(
      static_cast<int64_t>(c.requests.size()),
      [&](int64_t i) {
        const TraceRequest& r = c.requests[i];
        CountIds(trace.token_ids(r.offset), r.prompt_len, L, E, K, c.prefill_counts.data() + i * row);
        CountIds(trace.token_ids(r.offset + r.prompt_len), r.decode_len(), L, E, K, c.decode_counts.data() + i * row);
        if (!c.has_weights) return;
        float* gates = c.gate_sums.data() + i * row;
        for (int64_t t = 0; t < r.prompt_len; ++t) {
          const uint16_t* ids = trace.token_ids(r.offset + t);
          const float* w = trace.token_weights(r.offset + t);
          for (int l = 0; l < L; ++l) {
            for (int j = 0; j < K; ++j) gates[l * E + ids[l * K + j]] += w[l * K + j];
          }
        }
      },
      ThreadsFor(trace.num_tokens_total() * L * K));
  return c;
}

Result<TraceCounts> ReadTraceCounts(const std::string& path, const TraceReadOptions& options) {
  const auto read_whole = [&]() -> Result<TraceCounts> {
    ELDR_ASSIGN_OR_RETURN(Trace t, ReadTrace(path, options));
    return CountTrace(t);
  };
  if (options.weights) return read_whole();
  ELDR_ASSIGN_OR_RETURN(std::unique_ptr<TraceStreamReader> reader, TraceStreamReader::Open(path));
  const Trace& header = reader->header();
  for (const TraceRequest& r : header.requests) {
    if (r.num_tokens > kMaxExactCountTokens) return read_whole();
  }
  const double bytes = 2.0 * sizeof(float) * header.shape.num_layers * header.shape.num_experts *
                       static_cast<double>(header.requests.size());
  ELDR_RETURN_IF_ERROR(CheckMemoryBudget(bytes, path + ": per-request expert counts"));
  TraceCounts c = EmptyCounts(header, false);
  BlockCounter counter(&c, TraceStreamReader::NumWorkers(options));
  ELDR_RETURN_IF_ERROR(reader->ReadIds(options, [&](int64_t first, int64_t n, const uint16_t* ids, int worker) {
    counter.Count(first, n, ids, worker);
  }));
  return c;
}

RequestFeatures FeaturesFromCounts(const TraceCounts& c, const std::vector<int32_t>& request_indices) {
  RequestFeatures f;
  f.num_requests = static_cast<int>(request_indices.size());
  f.num_layers = c.shape.num_layers;
  f.num_experts = c.shape.num_experts;
  f.request_index = request_indices;
  const size_t row = f.row_size();
  f.prefill_counts.resize(row * f.num_requests);
  f.decode_profile.resize(row * f.num_requests);
  f.decode_tokens.assign(f.num_requests, 0);
  if (c.has_weights) f.gate_sums.resize(row * f.num_requests);
  ParallelFor(
      f.num_requests,
      [&](int64_t i) {
        const size_t src = static_cast<size_t>(request_indices[i]) * row, dst = i * row;
        std::copy_n(c.prefill_counts.data() + src, row, f.prefill_counts.data() + dst);
        if (c.has_weights) std::copy_n(c.gate_sums.data() + src, row, f.gate_sums.data() + dst);
        const int64_t decode_len = c.requests[request_indices[i]].decode_len();
        f.decode_tokens[i] = decode_len;
        const float* d = c.decode_counts.data() + src;
        float* out = f.decode_profile.data() + dst;
        // As ComputeRequestFeatures: the count times the float reciprocal (a count of 0 stays 0 without decode).
        const float inv = decode_len > 0 ? 1.f / static_cast<float>(decode_len) : 1.f;
        for (size_t x = 0; x < row; ++x) out[x] = d[x] * inv;
      },
      ThreadsFor(static_cast<int64_t>(row) * f.num_requests));
  return f;
}

std::vector<float> ComputeIdf(const std::vector<float>& prefill_counts, int num_requests, int num_layers,
                              int num_experts) {
  const size_t row = static_cast<size_t>(num_layers) * num_experts;
  std::vector<int64_t> df(row, 0);
  for (int i = 0; i < num_requests; ++i) {
    const float* c = prefill_counts.data() + i * row;
    for (size_t x = 0; x < row; ++x) df[x] += c[x] > 0 ? 1 : 0;
  }
  std::vector<float> idf(row);
  for (size_t x = 0; x < row; ++x) {
    idf[x] = static_cast<float>(std::log((num_requests + 1.0) / (static_cast<double>(df[x]) + 1.0)));
  }
  return idf;
}

int SignatureParams::num_selected_layers() const {
  int n = 0;
  for (auto m : layer_mask) n += m ? 1 : 0;
  return n;
}

namespace {

// The definition of the normalisation: Σ x_i² summed in double in index order, inv = float(1 / sqrt(Σ)).
double SequentialNorm2(const float* x, size_t n) {
  double norm2 = 0;
  for (size_t i = 0; i < n; ++i) norm2 += static_cast<double>(x[i]) * x[i];
  return norm2;
}

// Sets *inv to float(1 / sqrt(SequentialNorm2(x, n))) and returns true when that sum is > 0, bit for bit,
// without the n dependent double additions (4 cycles each: 8 µs at n = 6144). Each term x_i² is exact in
// double and non-negative, so the in-order sum S_seq and the 32-lane sum S_vec below both lie within
// (n−1)·u·S of the exact S (u = 2^-53; Higham, Accuracy and Stability, §4.2), hence S_seq ∈ [lo, hi] =
// S_vec·(1 ∓ (2.01·n + 8)·u). sqrt, division and the conversion to float are correctly rounded, hence monotone,
// so float(1/sqrt(hi)) ≤ inv_seq ≤ float(1/sqrt(lo)): when the two ends agree they are inv_seq. They
// disagree only when 1/sqrt(S) lies within ~n·u relative of a float rounding boundary (~1e-5 of requests
// at n = 6144); then the in-order sum is taken.
bool L2Scale(const float* x, size_t n, float* inv) {
  // 4 × 8 double lanes (GCC does not vectorise the array form; four accumulators hide the add latency). Any order
  // of summation is within the bound above. The product of two floats is exact in double, so a fused multiply-add
  // gives the same lane sums as a multiply and an add.
  typedef float Float8 __attribute__((vector_size(32)));
  typedef double Double8 __attribute__((vector_size(64)));
  Double8 acc[4] = {};
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int a = 0; a < 4; ++a) {
      Float8 f;
      std::memcpy(&f, x + i + 8 * a, sizeof f);
      const Double8 d = __builtin_convertvector(f, Double8);
      acc[a] += d * d;
    }
  }
  Double8 lane = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  for (; i + 8 <= n; i += 8) {
    Float8 f;
    std::memcpy(&f, x + i, sizeof f);
    const Double8 d = __builtin_convertvector(f, Double8);
    lane += d * d;
  }
  double sum = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  for (; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  if (!(sum > 0) || !std::isfinite(sum)) {  // all zero (then S_seq = 0 too), or inf/NaN: the definition
    const double norm2 = SequentialNorm2(x, n);
    if (!(norm2 > 0)) return false;
    *inv = static_cast<float>(1.0 / std::sqrt(norm2));
    return true;
  }
  const double rel =
      (2.01 * static_cast<double>(n) + 8) * 0x1p-53;  // + 8u: the roundings of rel, 1 ± rel, the products
  const float a = static_cast<float>(1.0 / std::sqrt(sum * (1 + rel)));
  const float b = static_cast<float>(1.0 / std::sqrt(sum * (1 - rel)));
  *inv = a == b ? a : static_cast<float>(1.0 / std::sqrt(SequentialNorm2(x, n)));
  return true;
}

}  // namespace

void ComputeSignature(const SignatureParams& p, const float* counts, const float* gate_sums, float* out) {
  // One branch per layer and variant, straight loops inside, so the compiler vectorises them.
  const int E = p.num_experts;
  float* o = out;
  for (int l = 0; l < p.num_layers; ++l) {
    if (!p.layer_mask[l]) continue;
    const size_t base = static_cast<size_t>(l) * E;
    const float* c = counts + base;
    const float* w = p.idf.data() + base;
    switch (p.variant) {
      case SignatureVariant::kCount:
        for (int e = 0; e < E; ++e) o[e] = c[e];
        break;
      case SignatureVariant::kCountIdf:
        for (int e = 0; e < E; ++e) o[e] = c[e] * w[e];
        break;
      case SignatureVariant::kSqrt:
        for (int e = 0; e < E; ++e) o[e] = c[e] > 0 ? std::sqrt(c[e]) : 0.f;
        break;
      case SignatureVariant::kBinary:
        for (int e = 0; e < E; ++e) o[e] = c[e] > 0 ? 1.f : 0.f;
        break;
      case SignatureVariant::kGateProb:
        for (int e = 0; e < E; ++e) o[e] = gate_sums ? gate_sums[base + e] : 0.f;
        break;
    }
    o += E;
  }
  const size_t n = static_cast<size_t>(o - out);
  float inv = 0.f;
  if (L2Scale(out, n, &inv)) {
    for (size_t i = 0; i < n; ++i) out[i] *= inv;
  }
}

Result<std::vector<float>> VariantFeatures(const RequestFeatures& f, SignatureVariant v,
                                           const std::vector<float>& idf) {
  if (v == SignatureVariant::kGateProb && f.gate_sums.empty()) {
    return Status::FailedPrecondition("signature variant gate_prob needs a trace with topk_weights");
  }
  const size_t row = f.row_size();
  std::vector<float> out(row * f.num_requests);
  for (int i = 0; i < f.num_requests; ++i) {
    for (size_t x = 0; x < row; ++x) {
      const size_t k = i * row + x;
      out[k] = VariantFeature(v, f.prefill_counts[k], f.gate_sums.empty() ? 0.f : f.gate_sums[k], idf[x]);
    }
  }
  return out;
}

}  // namespace eldr
