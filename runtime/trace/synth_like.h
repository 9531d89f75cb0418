// Synthetic workloads of unique requests fitted to a real routing trace (`eldr trace synth --like`).
//
// Model, per domain d (the real trace's labels; an unlabelled trace is one domain), per MoE layer ℓ, with two
// phase means μ_d,p(ℓ,·) (p = prefill, decode; each sums to 1) and μ̄_d = (μ_d,prefill + μ_d,decode)/2:
//   ω_r(ℓ,·) ~ Dirichlet(α_d · μ̄_d(ℓ,·))              the request's own deviation, shared by both phases
//   π_r,p(ℓ,e) ∝ ω_r(ℓ,e) · μ_d,p(ℓ,e) / μ̄_d(ℓ,e)      its expert distribution in phase p
//   token t of r at ℓ: top-k drawn without repetition, Plackett–Luce from π_r,p(ℓ,·) (sequential draws, repeats
//                      rejected; the draw order is the top-k order), p = prefill for t < prompt_len
// A request's prefill and decode tokens draw from the same ω_r, so its prefill predicts its decode through the
// fitted per-request spread, not by construction. The phase means differ because real prompts and answers
// route differently (ESFT intent: Chinese prompt, JSON answer, domain prefill/decode correlation 0.33): with one
// distribution for both phases the generated correlation would be ~1.0 wherever the real one is not.
// A request's domain follows the real domain mix; its (prompt, decode) lengths are a uniformly chosen real
// request's of that domain, both scaled by one factor exp(σ·z), z ~ N(0,1), σ = length_jitter (the prompt share
// kept, >= 1 prompt token, a decode part stays non-empty). Only lengths are resampled: no real request's
// routing is copied or perturbed. Gate weights, when emitted, descend along the draw order:
// w_j = min(w_{j-1}, π(e_j)·jitter_j), jitter uniform in [0.5, 1.5), normalised to sum 1 (as synth.h).
//
// Fit (simulated method of moments, per domain). For a real request r and phase p with n tokens:
//   a_r,p(ℓ,e) = c(ℓ,e) / (k·n)          the phase's activation distribution (c = tokens whose top-k holds e)
//   m_d,p = (Σ_r a_r,p + β·g_p) / (R_d + β)   the domain's phase mean, β = 0.5 requests of the global mean g_p
//   D_d = Σ_{p,ℓ,e} [Var_r a_r,p − mean_r a_r,p(1 − k·a_r,p)/(k·(n − 1))] / Σ_{p,ℓ,e} m_d,p(1 − m_d,p)
// D_d is the between-request share of the variance once the token-sampling variance is removed; for a
// Dirichlet in activation space D = 1/(α+1), which gives the start α_d = 1/D_d − 1 (clamped to [0.05, 10^6];
// 10^6 = no spread beyond token sampling). Plackett–Luce flattens a distribution (an expert's inclusion
// probability is below k·π and capped at 1), so μ and α are then refined by simulation: the model is simulated
// (fixed seed, fit_requests requests of fit_tokens tokens, half prefill, per domain), the same statistics are
// computed on the simulated requests (m̂, D̂), and for fit_iterations rounds
//   μ_d,p ← normalise(μ_d,p · clamp(m_d,p/m̂_d,p, 1/2, 2)),   (α_d+1) ← (α_d+1) · D̂_d/D_d.
// A domain with fewer than 2 requests of >= 2 tokens takes the pooled D of the whole trace.
//
// Separation knob s (`--separation`, 1 = as fitted). With ḡ_p = Σ_d mix_d μ_d,p and ḡ = (ḡ_prefill + ḡ_decode)/2,
//   log μ_d,p^(s) = log ḡ_p + s·(log μ̄_d − log ḡ) + min(s, 1)·[(log μ_d,p − log μ̄_d) − (log ḡ_p − log ḡ)]
// then normalised per layer: the domain's deviation from the global mean (shared by both phases) is scaled by s,
// its own prefill/decode difference is kept. s = 1 is the fit, s = 0 makes all domains one, s > 1 pushes
// domains apart and sharpens each (its hot experts hotter, the others colder); α is kept. bench/README.md maps s
// to the same-domain vs mixed union gap.
//
// Novelty check: a request's decode profile (DESIGN.md §3) is compared by cosine with every real request's;
// the mean over generated requests of the nearest real similarity must not exceed the mean over real requests
// of the nearest *other* real similarity. A copy of a real request would score 1.
//
// Determinism: fixed by (model, options): std::mt19937_64 streams derived from the seed per request (domain,
// lengths and ω; ids; weights: ids do not depend on with_weights), and sampling.h's distributions. The fit is
// fixed by (trace, fit options).
// Complexity: fit O(T·L·k + iterations · D·fit_requests·(fit_tokens·L·k + L·E)) (~2.4 s for the bundled trace);
// generation O(Σ tokens·L·k) expected (rejections are rare unless π is nearly one-hot): 20 000 requests at the
// DeepSeek-V2-Lite shape (3.2 M tokens, 1.5 GB written) took 128 s of CPU with a 49 MB peak RSS; memory
// O(D·L·E + one request's tokens) plus the writer's per-request metadata.
// Thread safety: reentrant.
#pragma once

#include <cmath>
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
  // The most routing entries (tokens x layers x top-k) a generated trace may hold, checked on the expected size
  // before the first request and on the running total after each: kMaxSynthEntries (2^34); tests lower it.
  double max_entries = kMaxSynthEntries;
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
  double real_nearest_mean = 0;             // mean over real requests of the nearest other real cosine similarity
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
