// Synthetic workloads of unique requests fitted to a real routing trace (`eldr trace synth --like`).
//
// Model, per domain d (the real trace's labels; an unlabelled trace is one domain), per MoE layer ℓ:
//   π_r(ℓ,·) ~ Dirichlet(α_d · μ_d(ℓ,·))           a request's own expert distribution (PL weights), Σ_e μ = 1
//   token t of r at ℓ: top-k drawn without repetition, Plackett–Luce from π_r(ℓ,·) (sequential draws, repeats
//                      rejected; the draw order is the top-k order)
// Prefill and decode tokens of a request draw from the same π_r, so the prefill→decode correlation arises
// from the per-request spread rather than being imposed. A request's domain follows the real domain mix; its
// (prompt, decode) lengths are a uniformly chosen real request's of that domain, both scaled by one factor
// exp(σ·z), z ~ N(0,1), σ = length_jitter (the prompt share kept, >= 1 prompt token, a decode part stays
// non-empty). Only lengths are resampled: no real request's routing is copied or perturbed.
// Gate weights, when emitted, descend along the draw order: w_j = min(w_{j-1}, π(e_j)·jitter_j),
// jitter uniform in [0.5, 1.5), normalised to sum 1 (as synth.h).
//
// Fit (simulated method of moments, per domain). For a real request r with n_r tokens (prefill + decode):
//   a_r(ℓ,e) = c_r(ℓ,e) / (k·n_r)       its activation distribution (c_r = tokens whose top-k holds e)
//   m_d = (Σ_r a_r + β·g) / (R_d + β)    the domain's mean, β = 0.5 requests of the global mean g (no zeros)
//   D_d = Σ_{ℓ,e} [Var_r a_r(ℓ,e) − mean_r a_r(1 − k·a_r)/(k·(n_r − 1))] / Σ_{ℓ,e} m_d(1 − m_d)
// D_d is the between-request share of the variance after removing the token-sampling variance; for a
// Dirichlet in activation space D = 1/(α+1), which gives the start α_d = 1/D_d − 1. Plackett–Luce flattens
// a distribution (an expert's inclusion probability is below k·π and capped at 1), so μ and α are then
// refined by simulation: the model is simulated (fixed seed, fit_requests requests of fit_tokens tokens per
// domain), the same two statistics are computed on the simulated requests (m̂, D̂), and
//   μ ← normalise(μ · clamp(m/m̂, 1/2, 2)),   (α+1) ← (α+1) · D̂/D          for fit_iterations rounds.
// A domain with fewer than 2 requests with >= 2 tokens takes the pooled D of the others.
//
// Separation knob s (`--separation`, 1 = as fitted): every domain's mean moves along the log-linear path
// through the traffic-weighted global mean ḡ = Σ_d mix_d μ_d:  μ_d^(s)(ℓ,·) ∝ ḡ^(1−s) · μ_d^s.
// s = 0 makes all domains one, s < 1 brings them closer, s > 1 pushes them apart and sharpens each (its hot
// experts hotter, the others colder); α is kept. bench/README.md maps s to the same-domain vs mixed union gap.
//
// Novelty check: a request's decode profile (DESIGN.md §3) is compared by cosine with every real request's;
// the mean over generated requests of the nearest real similarity must not exceed the mean over real requests
// of the nearest *other* real similarity. A copy of a real request would score 1.
//
// Determinism: fixed by (model, options) — std::mt19937_64 streams derived from the seed per request, and
// sampling.h's distributions. The fit is fixed by (trace, fit options).
// Complexity: fit O(T·L·k + iterations · D·fit_requests·(fit_tokens·L·k + L·E)); generation O(Σ tokens·L·k)
// expected (rejections are rare unless π is nearly one-hot), memory O(D·L·E + one request's tokens).
// Thread safety: reentrant.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/common/status.h"
#include "runtime/trace/trace.h"

namespace eldr {

struct LikeLengths {
  int64_t prompt_len = 0, decode_len = 0;
};

struct LikeDomain {
  std::string name;
  double mix = 0;                    // share of requests
  double concentration = 0;          // α_d
  double dispersion = 0;             // D_d of the real requests (the fit's target)
  std::vector<double> mean;          // [2, L, E] μ_d per phase (prefill, decode), each layer sums to 1
  std::vector<LikeLengths> lengths;  // the real requests' lengths, resampled with jitter
};

struct LikeModel {
  TraceShape shape;
  bool with_weights = false;  // the real trace had gate weights
  std::vector<LikeDomain> domains;
};

struct LikeFitOptions {
  int fit_iterations = 8;
  int fit_requests = 256;  // simulated requests per domain and round
  int fit_tokens = 64;     // tokens per simulated request
  uint64_t seed = 0;
};

// Errors (InvalidArgument, naming `--like`): a trace without requests or without decode tokens; bad options.
Result<LikeModel> FitLikeModel(const Trace& real, const LikeFitOptions& options = {});

struct LikeSynthOptions {
  int64_t num_requests = 1000;  // >= 1 (`--requests`)
  int num_domains = 0;          // 0 = the model's; otherwise must equal it (`--domains`)
  double separation = 1.0;      // s >= 0, finite (`--separation`)
  double length_jitter = 0.2;   // σ >= 0 (`--length-jitter`)
  bool with_weights = true;     // emit gate weights (the CLI: when the --like trace has them)
  uint64_t seed = 0;
};

// The model with every domain mean moved by the separation knob s (see above). REQUIRES: s >= 0.
LikeModel Separate(const LikeModel& model, double s);

// Receives one generated request: ids [num_tokens, L, k], weights the same shape or null.
using LikeSink = std::function<Status(const TraceRequest& request, const uint16_t* ids, const float* weights)>;

// Generates options.num_requests requests (ids "like-<domain>-<i>"), one at a time, into `sink` (streaming:
// memory is one request). Errors: InvalidArgument naming the option; the sink's first error.
Status GenerateLike(const LikeModel& model, const LikeSynthOptions& options, const LikeSink& sink);
// The same, into memory (tests, small traces). The result passes ValidateTrace.
Result<Trace> SynthesizeLikeTrace(const LikeModel& model, const LikeSynthOptions& options);

struct NoveltyReport {
  int64_t num_real = 0, num_generated = 0;  // requests with decode tokens compared
  double real_nearest_mean = 0;       // mean over real requests of the nearest other real cosine similarity
  double real_nearest_max = 0;
  double generated_nearest_mean = 0;  // mean over generated requests of the nearest real cosine similarity
  double generated_nearest_max = 0;
  bool novel() const { return generated_nearest_mean <= real_nearest_mean; }
  nlohmann::json ToJson() const;
  std::string ToText() const;
};

// Decode profiles of the real trace's requests with decode tokens; generated requests are added one at a
// time (the first max_generated; the rest are ignored) and compared by Report(). Cost O(R²·L·E) to build,
// O(R·L·E) per added request.
class NoveltyChecker {
 public:
  // Errors: InvalidArgument when fewer than 2 real requests have decode tokens.
  static Result<NoveltyChecker> Create(const Trace& real, int64_t max_generated = 2000);
  void Add(const TraceRequest& request, const uint16_t* ids);  // ids [num_tokens, L, k]
  NoveltyReport Report() const;

 private:
  NoveltyChecker() = default;
  TraceShape shape_;
  int64_t max_generated_ = 0;
  std::vector<float> real_;  // [R, L·E] L2-normalised decode profiles
  std::vector<float> scratch_;
  NoveltyReport report_;
  double generated_sum_ = 0;
};

}  // namespace eldr
