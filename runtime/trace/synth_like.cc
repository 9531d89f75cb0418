#include "runtime/trace/synth_like.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <sstream>
#include <unordered_map>

#include "runtime/common/json_util.h"
#include "runtime/common/memory_budget.h"
#include "runtime/common/signals.h"
#include "runtime/trace/sampling.h"

namespace eldr {

namespace {

using trace_sampling::AliasBucket;
using trace_sampling::AliasTable;
using trace_sampling::DrawAlias;
using trace_sampling::LogGamma01;
using trace_sampling::StandardNormal;
using trace_sampling::StreamSeed;
using trace_sampling::UniformBelow;
using trace_sampling::UniformUnit;

enum LikeStream : uint64_t { kFitStream = 11, kRequestStream = 12, kTokenStream = 13, kWeightStream = 14 };

constexpr double kPriorRequests = 0.5;               // β: pseudo-requests of the global mean in a domain's mean
constexpr double kMinAlpha = 0.05, kMaxAlpha = 1e6;  // α range; kMaxAlpha: no spread beyond token sampling

// Per-(layer, expert) moments of request activation distributions: the domain mean and the between-request
// dispersion D of the header.
class MomentAccumulator {
 public:
  MomentAccumulator(size_t cells, int top_k) : k_(top_k), sum_(cells), sum2_(cells), noise_(cells) {}

  // a: [L·E] activation distribution of a request of n tokens.
  void Add(const double* a, int64_t n) {
    ++count_;
    for (size_t c = 0; c < sum_.size(); ++c) {
      sum_[c] += a[c];
      sum2_[c] += a[c] * a[c];
    }
    if (n < 2) return;
    ++noise_count_;
    for (size_t c = 0; c < sum_.size(); ++c) noise_[c] += a[c] * (1 - k_ * a[c]) / (k_ * (n - 1.0));
  }

  int64_t count() const { return count_; }
  int64_t noise_count() const { return noise_count_; }
  const std::vector<double>& sum() const { return sum_; }

  // Adds this accumulator's between-request variance and its scale Σ m(1 − m) to *between and *scale; false (and
  // nothing added) with fewer than two requests of >= 2 tokens.
  bool AddDispersion(double* between, double* scale) const {
    if (noise_count_ < 2 || count_ < 2) return false;
    const double r = static_cast<double>(count_);
    for (size_t c = 0; c < sum_.size(); ++c) {
      const double mean = sum_[c] / r;
      const double var = std::max(0.0, (sum2_[c] - r * mean * mean) / (r - 1));
      *between += var - noise_[c] / static_cast<double>(noise_count_);
      *scale += mean * (1 - mean);
    }
    return true;
  }

 private:
  double k_;
  std::vector<double> sum_, sum2_, noise_;  // [L·E]
  int64_t count_ = 0, noise_count_ = 0;
};

// Draws one token's top-k at one layer without repetition, Plackett–Luce from p (tl: its alias table):
// sequential draws, repeats rejected; after 16k rejections (p nearly one-hot) the remaining experts are drawn
// exactly by a scan of the unused mass (uniformly when that mass is 0). mark/stamp: mark[e] == stamp means e
// is taken. ids: [k].
void DrawTopK(std::mt19937_64& rng, const AliasBucket* tl, const double* p, int E, int K, std::vector<uint32_t>* mark,
              uint32_t stamp, uint16_t* ids) {
  int n = 0;
  auto accept = [&](uint16_t e) {
    ids[n] = e;
    n += (*mark)[e] != stamp;
    (*mark)[e] = stamp;
  };
  for (int tries = 0; n < K && tries < 16 * K + 64; tries += 2) {
    const uint64_t bits = rng();
    accept(DrawAlias(static_cast<uint32_t>(bits >> 32), static_cast<uint32_t>(E), tl));
    if (n < K) accept(DrawAlias(static_cast<uint32_t>(bits), static_cast<uint32_t>(E), tl));
  }
  while (n < K) {
    double rest = 0;
    int unused = 0;
    for (int e = 0; e < E; ++e) {
      if ((*mark)[e] != stamp) rest += p[e], ++unused;
    }
    int pick = -1;
    if (rest > 0) {
      double u = UniformUnit(rng) * rest;
      for (int e = 0; e < E; ++e) {
        if ((*mark)[e] == stamp || p[e] <= 0) continue;
        pick = e;
        if ((u -= p[e]) < 0) break;
      }
    } else {
      int i = static_cast<int>(UniformBelow(rng, static_cast<uint64_t>(unused)));
      for (int e = 0; e < E; ++e) {
        if ((*mark)[e] != stamp && i-- == 0) pick = e;
      }
    }
    (*mark)[pick] = stamp;
    ids[n++] = static_cast<uint16_t>(pick);
  }
}

// Generates the tokens of one request from its per-layer, per-phase distributions; reused buffers.
class RequestSampler {
 public:
  explicit RequestSampler(const TraceShape& shape)
      : L_(shape.num_layers),
        E_(shape.num_experts),
        K_(shape.top_k),
        builder_(E_),
        table_(2 * static_cast<size_t>(L_) * E_),
        pi_(2 * static_cast<size_t>(L_) * E_),
        omega_(E_),
        mark_(E_, 0) {}

  // ω(ℓ,·) ~ Dirichlet(alpha · μ̄(ℓ,·)), μ̄ = (μ_prefill + μ_decode)/2; π_phase ∝ ω · μ_phase / μ̄.
  // mean: [2, L, E] (prefill, decode).
  void DrawDistribution(std::mt19937_64& rng, const std::vector<double>& mean, double alpha) {
    const size_t cells = static_cast<size_t>(L_) * E_;
    for (int l = 0; l < L_; ++l) {
      const double* m0 = &mean[static_cast<size_t>(l) * E_];
      const double* m1 = m0 + cells;
      double top = -std::numeric_limits<double>::infinity();
      for (int e = 0; e < E_; ++e) {
        const double base = 0.5 * (m0[e] + m1[e]);
        omega_[e] = base > 0 ? LogGamma01(rng, alpha * base) : -std::numeric_limits<double>::infinity();
        top = std::max(top, omega_[e]);
      }
      for (int e = 0; e < E_; ++e) omega_[e] = std::exp(omega_[e] - top);
      for (int phase = 0; phase < 2; ++phase) {
        const double* m = phase == 0 ? m0 : m1;
        double* p = &pi_[phase * cells + static_cast<size_t>(l) * E_];
        double sum = 0;
        for (int e = 0; e < E_; ++e) {
          const double base = 0.5 * (m0[e] + m1[e]);
          sum += (p[e] = base > 0 ? omega_[e] * m[e] / base : 0.0);
        }
        if (!(sum > 0)) {  // every drawn ω was 0 where this phase has mass: fall back to the phase mean
          for (int e = 0; e < E_; ++e) sum += (p[e] = m[e]);
        }
        for (int e = 0; e < E_; ++e) p[e] /= sum;
        builder_.Build(p, &table_[phase * cells + static_cast<size_t>(l) * E_]);
      }
    }
  }

  // n tokens of one phase (0 prefill, 1 decode); ids: [n, L, k]; weights: same shape or null.
  void DrawTokens(std::mt19937_64& id_rng, std::mt19937_64& weight_rng, int64_t n, int phase, uint16_t* ids,
                  float* weights) {
    const size_t base = phase * static_cast<size_t>(L_) * E_;
    for (int64_t t = 0; t < n; ++t) {
      for (int l = 0; l < L_; ++l, ids += K_) {
        if (++stamp_ == 0) {  // wrapped: forget every old stamp
          std::fill(mark_.begin(), mark_.end(), 0);
          stamp_ = 1;
        }
        const double* p = &pi_[base + static_cast<size_t>(l) * E_];
        DrawTopK(id_rng, &table_[base + static_cast<size_t>(l) * E_], p, E_, K_, &mark_, stamp_, ids);
        if (weights == nullptr) continue;
        float prev = std::numeric_limits<float>::max(), sum = 0;
        uint64_t bits = 0;
        for (int j = 0; j < K_; ++j) {
          if (j % 8 == 0) bits = weight_rng();
          const float jitter = 0.5f + static_cast<float>(bits & 0xff) * (1.0f / 256.0f);
          bits >>= 8;
          prev = weights[j] = std::min(prev, static_cast<float>(p[ids[j]]) * jitter);
          sum += weights[j];
        }
        for (int j = 0; j < K_; ++j) weights[j] = sum > 0 ? weights[j] / sum : 1.0f / K_;
        weights += K_;
      }
    }
  }

 private:
  int L_, E_, K_;
  AliasTable builder_;
  std::vector<AliasBucket> table_;  // [2, L, E]
  std::vector<double> pi_;          // [2, L, E]
  std::vector<double> omega_;       // [E]
  std::vector<uint32_t> mark_;      // [E]
  uint32_t stamp_ = 0;
};

// Activation distribution a(ℓ,e) = count / (k·n) of n tokens; ids: [n, L, k]; a: [L·E].
void Activation(const TraceShape& s, const uint16_t* ids, int64_t n, std::vector<double>* a) {
  std::fill(a->begin(), a->end(), 0.0);
  if (n <= 0) return;
  const double w = 1.0 / (static_cast<double>(s.top_k) * static_cast<double>(n));
  for (int64_t t = 0; t < n; ++t) {
    for (int l = 0; l < s.num_layers; ++l) {
      for (int j = 0; j < s.top_k; ++j, ++ids) (*a)[static_cast<size_t>(l) * s.num_experts + *ids] += w;
    }
  }
}

void NormaliseLayers(int num_rows, int E, std::vector<double>* v) {
  for (int l = 0; l < num_rows; ++l) {
    double* p = &(*v)[static_cast<size_t>(l) * E];
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += p[e];
    if (sum > 0) {
      for (int e = 0; e < E; ++e) p[e] /= sum;
    }
  }
}

// The moments the fit matches, per phase (prefill, decode): the requests' mean activation and its dispersion D,
// pooled over the two phases (each phase is a pure draw from its own distribution, so a request's prompt share
// does not enter the spread).
struct DomainMoments {
  DomainMoments(size_t cells, int k) : phase{MomentAccumulator(cells, k), MomentAccumulator(cells, k)} {}
  MomentAccumulator phase[2];

  // ids: [prompt_len + decode_len, L, k]; scratch: [L·E].
  void Add(const TraceShape& s, const uint16_t* ids, int64_t prompt_len, int64_t decode_len, std::vector<double>* a) {
    if (prompt_len > 0) {
      Activation(s, ids, prompt_len, a);
      phase[0].Add(a->data(), prompt_len);
    }
    if (decode_len > 0) {
      Activation(s, ids + prompt_len * static_cast<size_t>(s.num_layers) * s.top_k, decode_len, a);
      phase[1].Add(a->data(), decode_len);
    }
  }

  // NaN when neither phase has two requests of >= 2 tokens.
  double Dispersion() const {
    double between = 0, scale = 0;
    const bool any = phase[0].AddDispersion(&between, &scale) | phase[1].AddDispersion(&between, &scale);
    return any && scale > 0 ? std::max(between / scale, 0.0) : NAN;
  }
};

// Simulates fit_requests requests of fit_tokens tokens (half prefill) of one domain; returns their moments.
DomainMoments Simulate(const TraceShape& shape, const LikeDomain& d, const LikeFitOptions& o, uint64_t stream) {
  const size_t cells = static_cast<size_t>(shape.num_layers) * shape.num_experts;
  DomainMoments moments(cells, shape.top_k);
  RequestSampler sampler(shape);
  std::mt19937_64 rng(StreamSeed(o.seed, kFitStream, stream));  // the same numbers every round
  const int64_t prefill = o.fit_tokens / 2, decode = o.fit_tokens - prefill;
  const size_t stride = static_cast<size_t>(shape.num_layers) * shape.top_k;
  std::vector<uint16_t> ids(static_cast<size_t>(o.fit_tokens) * stride);
  std::vector<double> a(cells);
  for (int j = 0; j < o.fit_requests; ++j) {
    sampler.DrawDistribution(rng, d.mean, d.concentration);
    sampler.DrawTokens(rng, rng, prefill, 0, ids.data(), nullptr);
    sampler.DrawTokens(rng, rng, decode, 1, ids.data() + prefill * stride, nullptr);
    moments.Add(shape, ids.data(), prefill, decode, &a);
  }
  return moments;
}

// One simulated-moments round for a domain: phase means and concentration moved towards the real moments.
// target: [2, L, E].
void RefineDomain(const TraceShape& shape, const std::vector<double>& target, const LikeFitOptions& o, uint64_t stream,
                  LikeDomain* d) {
  const DomainMoments sim = Simulate(shape, *d, o, stream);
  const size_t cells = static_cast<size_t>(shape.num_layers) * shape.num_experts;
  for (int phase = 0; phase < 2; ++phase) {
    const double n = static_cast<double>(sim.phase[phase].count());
    for (size_t c = 0; c < cells; ++c) {
      double& m = d->mean[phase * cells + c];
      if (m <= 0) continue;
      const double simulated = sim.phase[phase].sum()[c] / n;
      m *= std::clamp(simulated > 0 ? target[phase * cells + c] / simulated : 2.0, 0.5, 2.0);
    }
  }
  NormaliseLayers(2 * shape.num_layers, shape.num_experts, &d->mean);
  const double simulated_d = sim.Dispersion();
  if (std::isfinite(simulated_d) && simulated_d > 0 && d->dispersion > 0) {
    d->concentration = std::clamp((d->concentration + 1) * simulated_d / d->dispersion - 1, kMinAlpha, kMaxAlpha);
  }
}

Status BadOption(const std::string& m) { return Status::InvalidArgument("trace synth --like: " + m); }

// The entry bound as a user reads it: "2^34, 32 GiB of expert ids" for the default, else its value.
std::string EntryLimit(double max_entries) {
  return max_entries == kMaxSynthEntries ? "2^34 entries, 32 GiB of expert ids" : Fmt(max_entries, 0) + " entries";
}

}  // namespace

Result<LikeModel> FitLikeModel(const Trace& real, const LikeFitOptions& o) {
  if (o.fit_iterations < 0 || o.fit_requests < 2 || o.fit_tokens < 4) {
    return BadOption("fit needs iterations >= 0, requests >= 2 and tokens >= 4");
  }
  if (real.requests.empty()) return BadOption("--like trace has no requests");
  int64_t decode_tokens = 0, prompt_tokens = 0;
  for (const auto& r : real.requests) decode_tokens += r.decode_len(), prompt_tokens += r.prompt_len;
  if (decode_tokens == 0) {
    return BadOption(
        "--like trace has no decode tokens (every request ends with its prompt); nothing to fit decode "
        "routing to");
  }
  if (prompt_tokens == 0) return BadOption("--like trace has no prompt tokens; nothing to fit prefill routing to");
  const TraceShape& s = real.shape;
  const size_t cells = static_cast<size_t>(s.num_layers) * s.num_experts;
  LikeModel model;
  model.shape = s;
  model.with_weights = real.has_weights();
  std::unordered_map<std::string, int> index;
  std::vector<DomainMoments> moments;
  DomainMoments global(cells, s.top_k);
  std::vector<double> a(cells);
  for (const auto& r : real.requests) {
    auto [it, inserted] = index.emplace(r.domain, static_cast<int>(model.domains.size()));
    if (inserted) {
      model.domains.emplace_back();
      model.domains.back().name = r.domain;
      moments.emplace_back(cells, s.top_k);
    }
    model.domains[it->second].lengths.push_back(LikeLengths{r.prompt_len, r.decode_len()});
    moments[it->second].Add(s, real.token_ids(r.offset), r.prompt_len, r.decode_len(), &a);
    global.Add(s, real.token_ids(r.offset), r.prompt_len, r.decode_len(), &a);
  }
  const double pooled = global.Dispersion();  // for domains too small to measure their own spread
  std::vector<std::vector<double>> targets;
  for (size_t i = 0; i < model.domains.size(); ++i) {
    LikeDomain& d = model.domains[i];
    d.mix = static_cast<double>(d.lengths.size()) / static_cast<double>(real.requests.size());
    std::vector<double> m(2 * cells);
    for (int phase = 0; phase < 2; ++phase) {
      const MomentAccumulator& own = moments[i].phase[phase];
      const MomentAccumulator& all = global.phase[phase];
      for (size_t c = 0; c < cells; ++c) {
        m[phase * cells + c] = (own.sum()[c] + kPriorRequests * all.sum()[c] / static_cast<double>(all.count())) /
                               (static_cast<double>(own.count()) + kPriorRequests);
      }
    }
    NormaliseLayers(2 * s.num_layers, s.num_experts, &m);
    double disp = moments[i].Dispersion();
    if (!std::isfinite(disp)) disp = pooled;
    d.dispersion = std::isfinite(disp) ? disp : 0.0;
    d.concentration = d.dispersion > 0 ? std::clamp(1.0 / d.dispersion - 1.0, kMinAlpha, kMaxAlpha) : kMaxAlpha;
    d.mean = m;
    targets.push_back(std::move(m));
  }
  for (int it = 0; it < o.fit_iterations; ++it) {
    for (size_t i = 0; i < model.domains.size(); ++i) RefineDomain(s, targets[i], o, i, &model.domains[i]);
  }
  return model;
}

LikeModel Separate(const LikeModel& model, double sep) {
  LikeModel out = model;
  if (sep == 1.0) return out;
  const int L = model.shape.num_layers, E = model.shape.num_experts;
  const size_t cells = static_cast<size_t>(L) * E;
  std::vector<double> global(2 * cells, 0.0);  // ḡ_p, [2, L, E]
  double mix_sum = 0;
  for (const auto& d : model.domains) mix_sum += d.mix;
  for (const auto& d : model.domains) {
    for (size_t c = 0; c < 2 * cells; ++c) global[c] += d.mix / mix_sum * d.mean[c];
  }
  const double phase_share = std::min(sep, 1.0);
  for (auto& d : out.domains) {
    std::vector<double> moved(2 * cells, 0.0);
    for (size_t c = 0; c < cells; ++c) {
      const double dom = 0.5 * (d.mean[c] + d.mean[cells + c]), all = 0.5 * (global[c] + global[cells + c]);
      if (!(dom > 0) || !(all > 0)) continue;
      for (int p = 0; p < 2; ++p) {
        const double m = d.mean[p * cells + c], g = global[p * cells + c];
        if (!(m > 0) || !(g > 0)) continue;
        const double log_m = std::log(g) + sep * (std::log(dom) - std::log(all)) +
                             phase_share * ((std::log(m) - std::log(dom)) - (std::log(g) - std::log(all)));
        moved[p * cells + c] = std::exp(log_m);
      }
    }
    // Extrapolation can push a layer's small entries below double range; its top ones keep the layer positive.
    NormaliseLayers(2 * L, E, &moved);
    d.mean = std::move(moved);
  }
  return out;
}

Status GenerateLike(const LikeModel& model, const LikeSynthOptions& o, const LikeSink& sink) {
  if (o.num_requests < 1) return BadOption("--requests must be >= 1, got " + std::to_string(o.num_requests));
  const int num_domains = static_cast<int>(model.domains.size());
  if (num_domains == 0) return BadOption("the fitted model has no domains");
  if (o.num_domains != 0 && o.num_domains != num_domains) {
    return BadOption("--domains " + std::to_string(o.num_domains) + " does not match the " +
                     std::to_string(num_domains) + " domains of the --like trace (omit --domains)");
  }
  if (!std::isfinite(o.separation) || o.separation < 0 || o.separation > 100) {
    return BadOption("--separation must be in [0, 100], got " + std::to_string(o.separation));
  }
  if (!std::isfinite(o.length_jitter) || o.length_jitter < 0 || o.length_jitter > 5) {
    return BadOption("--length-jitter must be in [0, 5], got " + std::to_string(o.length_jitter));
  }
  // The expected size, before the first request: tokens per request are the domain's real lengths (mixed by the
  // domain shares) times exp(σ·z), whose mean is exp(σ²/2).
  {
    double mix = 0, tokens = 0;
    for (const LikeDomain& d : model.domains) {
      if (d.lengths.empty()) continue;
      double sum = 0;
      for (const LikeLengths& len : d.lengths)
        sum += static_cast<double>(std::max<int64_t>(1, len.prompt_len + len.decode_len));
      tokens += d.mix * sum / static_cast<double>(d.lengths.size());
      mix += d.mix;
    }
    const double per_request = (mix > 0 ? tokens / mix : 1) * std::exp(o.length_jitter * o.length_jitter / 2);
    const double entries =
        static_cast<double>(o.num_requests) * per_request * model.shape.num_layers * model.shape.top_k;
    if (entries > o.max_entries) {
      return BadOption("--requests " + std::to_string(o.num_requests) + " of about " + Fmt(per_request, 0) +
                       " tokens each (the real mean x exp(s^2/2) of --length-jitter " + Fmt(o.length_jitter, 2) +
                       ") is about " + Fmt(entries, 0) + " routing entries (tokens x " +
                       std::to_string(model.shape.num_layers) + " layers x top-" + std::to_string(model.shape.top_k) +
                       "), more than a generated trace may hold (" + EntryLimit(o.max_entries) +
                       "); lower --requests or --length-jitter");
    }
  }
  const LikeModel m = Separate(model, o.separation);
  const TraceShape& s = m.shape;
  std::vector<double> cum;
  double acc = 0;
  for (const auto& d : m.domains) {
    if (d.lengths.empty()) return BadOption("domain '" + d.name + "' has no requests");
    cum.push_back(acc += d.mix);
  }
  RequestSampler sampler(s);
  double entries_so_far = 0;
  std::vector<uint16_t> ids;
  std::vector<float> weights;
  for (int64_t i = 0; i < o.num_requests; ++i) {
    if (Interrupted()) return InterruptStatus();  // SIGINT/TERM/HUP: the caller's output temporary is removed
    std::mt19937_64 rng(StreamSeed(o.seed, kRequestStream, static_cast<uint64_t>(i)));
    std::mt19937_64 id_rng(StreamSeed(o.seed, kTokenStream, static_cast<uint64_t>(i)));
    std::mt19937_64 weight_rng(StreamSeed(o.seed, kWeightStream, static_cast<uint64_t>(i)));
    const double u = UniformUnit(rng) * acc;
    const int di =
        std::min(num_domains - 1, static_cast<int>(std::upper_bound(cum.begin(), cum.end(), u) - cum.begin()));
    const LikeDomain& d = m.domains[di];
    const LikeLengths& len = d.lengths[UniformBelow(rng, d.lengths.size())];
    const double scale = std::exp(o.length_jitter * StandardNormal(rng));
    const int64_t real_total = std::max<int64_t>(1, len.prompt_len + len.decode_len);
    // exp(jitter·N(0, 1)) is heavy-tailed: a request may draw far more tokens than any real one (and than memory),
    // so the draw is checked as a double, before it is rounded to an integer that could overflow.
    const double drawn = static_cast<double>(real_total) * scale;
    const size_t stride = static_cast<size_t>(s.num_layers) * s.top_k;
    if (drawn > static_cast<double>(kMaxRequestEntries) / static_cast<double>(stride)) {
      return BadOption("--length-jitter " + std::to_string(o.length_jitter) + " drew a request of " +
                       std::to_string(std::llround(std::min(drawn, 9e18))) + " tokens (" + std::to_string(real_total) +
                       " in the real trace), more than a request may hold; lower --length-jitter");
    }
    int64_t total = std::max<int64_t>(len.decode_len > 0 ? 2 : 1, std::llround(drawn));
    int64_t prompt = total;
    if (len.decode_len > 0) {
      prompt =
          std::clamp<int64_t>(std::llround(static_cast<double>(total) * len.prompt_len / real_total), 1, total - 1);
    }
    if (static_cast<size_t>(total) * stride > ids.capacity()) {  // only when the buffers grow, not per request
      ELDR_RETURN_IF_ERROR(CheckMemoryBudget(static_cast<double>(total) * stride * (o.with_weights ? 6 : 2),
                                             "--length-jitter " + std::to_string(o.length_jitter) + ": a request of " +
                                                 std::to_string(total) + " tokens"));
    }
    // The expected size was checked up front; a run of heavy-tailed draws is held to the same bound as it goes.
    entries_so_far += static_cast<double>(total) * static_cast<double>(stride);
    if (entries_so_far > o.max_entries) {
      return BadOption("the requests drawn so far (" + std::to_string(i + 1) + " of " + std::to_string(o.num_requests) +
                       ") hold more routing entries than a generated trace may hold (" + EntryLimit(o.max_entries) +
                       "); lower --requests or --length-jitter");
    }
    TraceRequest req;
    req.domain = d.name;
    req.id = d.name.empty() ? "like-" + std::to_string(i) : "like-" + d.name + "-" + std::to_string(i);
    req.prompt_len = prompt;
    req.num_tokens = total;
    sampler.DrawDistribution(rng, d.mean, d.concentration);
    ids.resize(static_cast<size_t>(total) * stride);
    if (o.with_weights) weights.resize(ids.size());
    float* w = o.with_weights ? weights.data() : nullptr;
    sampler.DrawTokens(id_rng, weight_rng, prompt, 0, ids.data(), w);
    sampler.DrawTokens(id_rng, weight_rng, total - prompt, 1, ids.data() + prompt * stride,
                       w == nullptr ? nullptr : w + prompt * stride);
    ELDR_RETURN_IF_ERROR(sink(req, ids.data(), o.with_weights ? weights.data() : nullptr));
  }
  return Status::Ok();
}

Result<Trace> SynthesizeLikeTrace(const LikeModel& model, const LikeSynthOptions& o) {
  Trace t;
  t.shape = model.shape;
  const size_t stride = static_cast<size_t>(t.shape.num_layers) * t.shape.top_k;
  ELDR_RETURN_IF_ERROR(GenerateLike(model, o, [&](const TraceRequest& r, const uint16_t* ids, const float* w) {
    TraceRequest req = r;
    req.offset = t.num_tokens_total();
    t.topk_ids.insert(t.topk_ids.end(), ids, ids + r.num_tokens * stride);
    if (w != nullptr) t.topk_weights.insert(t.topk_weights.end(), w, w + r.num_tokens * stride);
    t.requests.push_back(std::move(req));
    return Status::Ok();
  }));
  return t;
}

// ---- novelty ----

namespace {

constexpr size_t kMaxRealProfiles = 4000;  // real reference set: at most this many, evenly spaced

// L2-normalised decode profile of a request; ids: [num_tokens, L, k] from the request's first token. False
// without decode tokens.
bool DecodeProfile(const TraceShape& s, const TraceRequest& r, const uint16_t* ids, float* out) {
  const size_t cells = static_cast<size_t>(s.num_layers) * s.num_experts;
  std::fill(out, out + cells, 0.0f);
  if (r.decode_len() <= 0) return false;
  const size_t stride = static_cast<size_t>(s.num_layers) * s.top_k;
  for (int64_t t = r.prompt_len; t < r.num_tokens; ++t) {
    const uint16_t* row = ids + t * stride;
    for (int l = 0; l < s.num_layers; ++l) {
      for (int j = 0; j < s.top_k; ++j) out[static_cast<size_t>(l) * s.num_experts + row[l * s.top_k + j]] += 1.0f;
    }
  }
  double norm = 0;
  for (size_t c = 0; c < cells; ++c) norm += static_cast<double>(out[c]) * out[c];
  const float inv = static_cast<float>(1.0 / std::sqrt(norm));
  for (size_t c = 0; c < cells; ++c) out[c] *= inv;
  return true;
}

double Dot(const float* a, const float* b, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

}  // namespace

Result<NoveltyChecker> NoveltyChecker::Create(const Trace& real, int64_t max_generated) {
  NoveltyChecker c;
  c.shape_ = real.shape;
  c.max_generated_ = max_generated;
  const size_t cells = static_cast<size_t>(real.shape.num_layers) * real.shape.num_experts;
  std::vector<size_t> usable;
  for (size_t r = 0; r < real.requests.size(); ++r) {
    if (real.requests[r].decode_len() > 0) usable.push_back(r);
  }
  if (usable.size() < 2) return BadOption("novelty check needs >= 2 real requests with decode tokens");
  const size_t step = (usable.size() + kMaxRealProfiles - 1) / kMaxRealProfiles;
  for (size_t i = 0; i < usable.size(); i += step) {
    const TraceRequest& r = real.requests[usable[i]];
    c.real_.resize(c.real_.size() + cells);
    DecodeProfile(real.shape, r, real.token_ids(r.offset), &c.real_[c.real_.size() - cells]);
  }
  const size_t n = c.real_.size() / cells;
  c.report_.num_real = static_cast<int64_t>(n);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    double best = -1;
    for (size_t j = 0; j < n; ++j) {
      if (j != i) best = std::max(best, Dot(&c.real_[i * cells], &c.real_[j * cells], cells));
    }
    sum += best;
    c.report_.real_nearest_max = std::max(c.report_.real_nearest_max, best);
  }
  c.report_.real_nearest_mean = sum / static_cast<double>(n);
  c.scratch_.resize(cells);
  return c;
}

void NoveltyChecker::Add(const TraceRequest& request, const uint16_t* ids) {
  if (report_.num_generated >= max_generated_) return;
  if (!DecodeProfile(shape_, request, ids, scratch_.data())) return;
  const size_t cells = scratch_.size(), n = real_.size() / cells;
  double best = -1;
  for (size_t j = 0; j < n; ++j) best = std::max(best, Dot(scratch_.data(), &real_[j * cells], cells));
  ++report_.num_generated;
  generated_sum_ += best;
  report_.generated_nearest_max = std::max(report_.generated_nearest_max, best);
}

NoveltyReport NoveltyChecker::Report() const {
  NoveltyReport r = report_;
  r.generated_nearest_mean = r.num_generated > 0 ? generated_sum_ / static_cast<double>(r.num_generated) : NAN;
  return r;
}

nlohmann::json NoveltyReport::ToJson() const {
  return {{"num_real", num_real},
          {"num_generated", num_generated},
          {"real_nearest_mean", real_nearest_mean},
          {"real_nearest_max", real_nearest_max},
          {"generated_nearest_mean",
           std::isfinite(generated_nearest_mean) ? nlohmann::json(generated_nearest_mean) : nlohmann::json(nullptr)},
          {"generated_nearest_max", generated_nearest_max},
          {"novel", novel()}};
}

std::string NoveltyReport::ToText() const {
  std::ostringstream os;
  os << "novelty (decode-profile cosine to the nearest real request): generated mean " << Fmt(generated_nearest_mean)
     << " (max " << Fmt(generated_nearest_max) << ", " << num_generated << " requests) vs real-to-real mean "
     << Fmt(real_nearest_mean) << " (max " << Fmt(real_nearest_max) << ", " << num_real << " requests): "
     << (novel() ? "novel" : "NOT novel (generated requests sit nearer real ones than real ones do to each other)")
     << "\n";
  return os.str();
}

}  // namespace eldr
