// Decode routing (DESIGN.md §3 "Marginal-cost routing", "Band routing", "Baselines"). After prefill, the router picks
// the decode worker (decoder) of each request.
//
// Two layers:
//  - Decide(): a pure function of a snapshot of decoder states and the request's routing inputs;
//    deterministic given the random draws it is handed (random, p2c).
//  - Router: the stateful part. Owns the centroids, IDF and layer mask (from calibration.h5), tracks
//    in-flight counts (Dispatch / Complete), round-robin position and a seeded random stream.
//
// Thread safety: Router is not thread-safe; rank 0 owns one and calls it from one thread.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/calib/calibration.h"
#include "runtime/common/status.h"
#include "runtime/cost/cost_model.h"
#include "runtime/router/centroid_matrix.h"
#include "runtime/router/decode_length.h"
#include "runtime/router/predicted_union.h"
#include "runtime/signature/signature.h"

namespace eldr {

enum class RoutingPolicy { kRandom, kRoundRobin, kJsq, kP2c, kDomain, kLocalityTop1, kEldr, kEldrPaper, kEldrTail };

const char* RoutingPolicyName(RoutingPolicy p);  // "random", "round_robin", "jsq", "p2c", "domain", "locality_top1",
                                                 // "eldr", "eldr_paper", "eldr_tail"
Result<RoutingPolicy> ParseRoutingPolicy(const std::string& name);
std::vector<RoutingPolicy> AllRoutingPolicies();
// True for policies that need a signature and centroids.
bool UsesSignature(RoutingPolicy p);

// The routing settings a policy reads (the rules under Decide below); it ignores the others. The command line refuses
// an override that the policy it runs would ignore (commands.h CheckPolicyOptions); a config file may hold them all.
struct PolicySettings {
  bool calibration = false;  // a signature and centroids: UsesSignature
  bool tau = false;          // the band width τ: eldr_paper, eldr_tail
  bool load_bound = false;   // the bounded-load ε: eldr, eldr_paper, eldr_tail, locality_top1
  bool harm_weight = false;  // λ: eldr
  bool step_cost = false;    // the decode cost model it prices in and the decoders' max_batch: eldr
};
PolicySettings SettingsOf(RoutingPolicy p);

// One decoder as the router sees it.
struct DecoderState {
  int64_t in_flight = 0;      // requests dispatched and not completed (the JSQ load signal)
  int64_t admission_cap = 0;  // a decoder with in_flight >= cap is not eligible; 0 = no cap
  // Predicted decode tokens its in-flight requests still have to generate (eldr_tail's load signal): Σ over them of
  // DecodeLengthPrior::Remaining(their nearest cluster, output tokens generated so far) — the mean residual decode
  // length of the cluster's calibration members longer than that; 1 each without a calibration (work = in_flight).
  double work = 0;
  bool eligible() const { return admission_cap <= 0 || in_flight < admission_cap; }
};

struct RoutingDecision {
  int decoder = -1;             // -1: no decoder can admit the request now (all at their cap)
  int band_size = 0;            // eldr / locality_top1: |B|; 0 for load-only policies
  bool fallback = false;        // no eligible decoder in the band (see each policy's rule in Decide)
  double distance = 0;          // d_k of the chosen decoder (signature policies)
  bool overflow = false;        // eldr_tail: no band member under the bounds; a next-nearest decoder took it
  int nearest = -1;             // signature policies: argmin_k d_k (tie → lower k), the request's cluster
  double predicted_tokens = 1;  // signature policies: PriorDecodeTokens(its cluster), eldr_tail's w_r; else 1
  double context = 0;           // the request's prompt tokens (signature policies; eldr's context term)
  double predicted_cost = 0;    // eldr: the chosen decoder's marginal cost (s per decode step)
  int64_t ticket = -1;          // the request's in-flight record (Router::Dispatch, ConsumeToken, Complete)
};

// The inputs of one decision. Pointers are borrowed for the call.
struct DecisionInputs {
  RoutingPolicy policy = RoutingPolicy::kJsq;
  const std::vector<DecoderState>* decoders = nullptr;  // [K]
  const double* distances = nullptr;                    // [K] d_k = 1 − s·μ_k (signature policies)
  double tau = 0.1;
  double load_bound = 0;  // ε of the bounded load (eldr_paper, locality_top1, eldr_tail, eldr; see below); 0 = off
  const std::vector<int>* domain_group = nullptr;  // decoders of the request's domain (domain policy); null/empty = all
  uint64_t random_a = 0, random_b = 0;             // uniform 64-bit draws (random: a; p2c: a and b)
  int64_t round_robin_next = 0;                    // the round-robin counter
  double request_work = 1;                         // eldr_tail: w_r, the request's predicted decode tokens (> 0)
  const double* marginal_cost = nullptr;           // [K] eldr: Router::MarginalCost of each decoder
  int64_t max_batch = 0;                           // eldr: sequences per decode step (0 = unbounded)
};

// The pure decision. Rules (DESIGN.md §3):
//  eldr_paper (the published band): B = {k : d_k ≤ min_j d_j + τ}; argmin load over eligible k in B, tie → smaller d_k,
//  then lower k;
//        if B has no eligible decoder, the globally least-loaded eligible decoder (fallback = true).
//        With load_bound ε > 0 (an extension, off by default): band members holding at least
//        ceil((1+ε)·(Σ_k in_flight_k + 1)/K) requests are not candidates ("consistent hashing with bounded
//        loads", Mirrokni et al. 2018), so the fallback takes over before one decoder's queue runs away.
//  eldr_tail (tail-safe, DESIGN.md §3 "Tail-safe band"): loads are w_k = DecoderState::work, the request's
//        w_r = request_work. Decoder k is under the bounds iff w_k < W = (1+ε)·(Σ_j w_j + w_r)/K and
//        in_flight_k < N = ceil((1+ε)·(Σ_j in_flight_j + 1)/K) (ε = load_bound): work in decode tokens, and
//        sequences, which a cluster of short requests would otherwise pile onto one decoder's batch.
//        B as above; argmin w_k over eligible band members under the bounds, tie → smaller d_k, then lower k.
//        None: overflow in distance order — the first eligible decoder under the bounds in ascending
//        (d_k, k) (overflow = true, fallback = true); none at all (no eligible decoder under both): the
//        eligible decoder of least max(w_k / W, in_flight_k / N), tie → lower k (fallback = true).
//  eldr (the default; marginal cost, DESIGN.md §3 "Marginal-cost routing"): argmin marginal_cost[k] over eligible
//        decoders with in_flight < max_batch (a full one would queue the request), tie → smaller d_k, then lower
//        k; when every eligible decoder is full, the one of fewest in_flight (tie → the cheaper, then as above).
//        With load_bound ε > 0 (off by default): a decoder whose work w_k >= (1+ε)·(Σ_j w_j + w_r)/K (eldr_tail's
//        work bound W, w_r = request_work) is a second choice, after the eligible non-full decoders under it and
//        before the full ones; among them, as above.
//  locality_top1: eldr_paper with τ = 0.
//  jsq: argmin load over eligible decoders, tie → lower index.
//  p2c: two distinct decoders drawn from a and b among the eligible ones; the less loaded (tie → lower index).
//  random: uniform over eligible decoders. round_robin: the next eligible decoder from round_robin_next.
//  domain: jsq within the request's domain group (eligible members), else jsq over all.
// When no decoder is eligible at all (every one at its admission cap), every policy returns decoder = -1
// with fallback = true: the request waits at the router until a completion frees a slot.
RoutingDecision Decide(const DecisionInputs& in);

// eldr's default λ (RouterConfig::harm_weight).
inline constexpr double kHarmWeight = 0.75;

// eldr_tail's ε when routing.load_bound is 0 or unset.
inline constexpr double kTailLoadBound = 0.25;

// The ε a policy routes with when routing.load_bound is unset: kTailLoadBound for eldr_tail, 0 (off) for the others.
// eldr's bound stays off by default. At 2000 requests ε = 0.3 removed the --like s = 1 tail misses at K = 8 / 16,
// but not at 20 000. It took the demo's locality at K = 2, where (1 + ε)/K caps a decoder at 65 % of the work
// (bench/README "A load bound for eldr").
double DefaultLoadBound(RoutingPolicy policy);

// The ε a policy routes with given routing.load_bound: unset → DefaultLoadBound(policy); eldr_tail's 0 →
// kTailLoadBound (its bound is never off); otherwise the value. What the router uses and metrics.json records.
double RoutedLoadBound(RoutingPolicy policy, std::optional<double> load_bound);

struct RouterConfig {
  RoutingPolicy policy = RoutingPolicy::kEldr;
  int num_decoders = 1;
  std::optional<double> tau = 0.1;  // eldr band width; std::nullopt: the calibration's (0.1 without one)
  // ε of the bounded load (see Decide); unset: DefaultLoadBound(policy); 0 = off (eldr_tail: 0 → kTailLoadBound).
  std::optional<double> load_bound;
  int64_t admission_cap = 0;  // per decoder; 0 = none
  uint64_t seed = 0;
  TraceShape job_shape;  // the model of the job; must match the calibration's
  // Domain labels for the domain policy (its decoder groups); empty = the calibration's labels.
  std::vector<std::string> domains;
  // eldr: the decode step cost model the marginal cost is priced in (required for eldr, unused
  // otherwise) and the decoders' max_batch (sequences per step; later ones queue).
  std::optional<CostModel> step_cost;
  int64_t max_batch = 64;
  // eldr: the weight λ of what the request adds to the running requests' TPOT (1 = the social optimum, which lets
  // a domain's decoder grow slower than the others; 0 = the request's own step time only, Wardrop-like, which
  // gives up locality). 0.75: chosen on seed 1 of the --like workloads (bench/README "Marginal-cost routing").
  double harm_weight = kHarmWeight;
  // Output tokens a request has generated when it is routed, counted as the calibration's decode lengths count them
  // (a request's L includes the token its prefill returns): 1 in serve and simulate, which route a request when its
  // prefill's token comes back; 0 in `eldr route`'s replay, which routes before the first of its L tokens. Its
  // record starts at g = this, its prediction at DecodeLengthPrior::Remaining(cluster, this).
  int64_t tokens_at_routing = 0;
};

class Router {
 public:
  // Signature policies need `calib`; its model shape and K must match the job. `calib` may be null
  // for load-only policies (domain groups then come from the labels seen at routing time).
  static Result<Router> Create(const RouterConfig& config, const Calibration* calib);

  // Routes a request with its prefill counts [L, E] (c_r(ℓ,e); only the signature's masked layers need be filled,
  // as SignatureCache::SumCounts leaves them); `gate_sums` [L, E] only for gate_prob signatures (may be null).
  // `domain` is used by the domain policy only. The request's context (eldr) is its prompt tokens, read from the
  // first masked layer's counts (Σ_e c_r(ℓ,e) = top_k · prompt tokens).
  RoutingDecision Route(const float* counts, const float* gate_sums, const std::string& domain);
  // Routes with a ready signature s_r ([signature_dim()]); `context`: the request's prompt tokens (eldr).
  RoutingDecision RouteSignature(const float* signature, const std::string& domain);
  RoutingDecision RouteSignature(const float* signature, const std::string& domain, double context);

  // One more request in flight on `decoder`, predicted to generate `work` decode tokens (a load without a record:
  // tests and benchmarks that set loads directly). REQUIRES: decoder >= 0.
  void Dispatch(int decoder, double work = 1);
  // The request of decision `d` is in flight on d.decoder: its predicted decode tokens, context and (eldr) expert
  // profile count from now on, and the router keeps its record (tokens generated, predicted remainder) until
  // Complete(d). A decision with ticket < 0 (hand-built in tests and benchmarks) is a load without a record: it
  // counts 1 in eldr's shares and holds d.predicted_tokens until Complete(d); ConsumeToken refuses it.
  // REQUIRES: d.decoder >= 0; a ticket >= 0 dispatched once.
  void Dispatch(const RoutingDecision& d);
  // The decoder's in-flight requests are predicted to generate `delta` more tokens (negative: a token came).
  void AddWork(int decoder, double delta);
  // The request of decision `d` generated one more decode token: its predicted remainder becomes
  // DecodeLengthPrior::Remaining(cluster, tokens generated) and its decoder's work changes by the difference.
  // REQUIRES: d dispatched and not completed.
  void ConsumeToken(const RoutingDecision& d);
  // One fewer on `decoder`, with `work_left` of its prediction unspent (the pair of Dispatch(decoder, work)).
  // REQUIRES: in_flight > 0.
  void Complete(int decoder, double work_left = 1);
  // The request dispatched with decision `d` finished (or failed): its record and what it held are released.
  void Complete(const RoutingDecision& d);
  // The predicted decode tokens still to come of the request of decision `d` (its record). REQUIRES: in flight.
  double RemainingTokens(const RoutingDecision& d) const;
  // eldr's price of sending a request of predicted profile `profile` (a cluster), `context` prompt tokens
  // and `tokens` predicted decode tokens to `decoder`, in seconds of decode-step time (DESIGN.md §3). Exposed
  // for tests. REQUIRES: policy eldr.
  double MarginalCost(int decoder, int profile, double context, double tokens) const;
  // eldr: the predicted expert unions (exposed for tests and benchmarks).
  const PredictedUnion& predicted_union() const { return union_; }
  // The decode tokens predicted for a request of cluster k when it is routed: DecodeLengthPrior::Remaining(k,
  // tokens_at_routing) (at 0, the calibration members' mean decode tokens, or /clusters/mean_decode_len[k] without
  // the lengths, or 1).
  double PriorDecodeTokens(int cluster) const { return lengths_.Remaining(cluster, config_.tokens_at_routing); }

  const std::vector<DecoderState>& decoders() const { return decoders_; }
  const SignatureParams& signature_params() const { return params_; }
  int signature_dim() const { return params_.dim(); }
  RoutingPolicy policy() const { return config_.policy; }
  double tau() const { return *config_.tau; }                // resolved by Create: always set
  double load_bound() const { return *config_.load_bound; }  // resolved by Create: always set
  // d_k of the last signature routed ([K]).
  const std::vector<double>& last_distances() const { return distances_; }

 private:
  Router() = default;
  const std::vector<int>* DomainGroup(const std::string& domain) const;
  RoutingDecision DecideNow(const double* distances, const std::string& domain, double context);
  // MarginalCost with the request's union growth ΔU_k given.
  double Price(int decoder, double growth, double context, double tokens) const;

  RouterConfig config_;
  SignatureParams params_;
  int context_layer_ = 0;      // the first masked layer (Route reads the prompt length from its counts)
  CentroidMatrix centroids_;   // [K, D], 16-bit fixed point
  DecodeLengthPrior lengths_;  // the predicted decode tokens of a cluster's requests
  std::vector<DecoderState> decoders_;
  std::vector<double> distances_;
  std::vector<float> dots_;                   // scratch [K]
  std::vector<int16_t> quantised_signature_;  // scratch [D] (CentroidMatrix::Dots)
  std::vector<float> signature_;              // scratch [D]
  std::map<std::string, std::vector<int>> domain_groups_;
  PredictedUnion union_;         // eldr: the predicted expert union of each decoder's in-flight requests
  std::vector<double> context_;  // [K] eldr: Σ over in-flight requests of prompt + prior/2 tokens
  std::vector<double> costs_;    // scratch [K]
  // The records of the requests dispatched with a decision, per decoder.
  struct InFlight {
    int64_t ticket;
    int cluster;        // the decision's nearest (−1: none)
    int64_t generated;  // output tokens so far (tokens_at_routing at dispatch)
    double remaining;   // predicted decode tokens still to come (DecodeLengthPrior::Remaining)
    // 1 / (its decode steps: generated − tokens_at_routing + remaining): its share of an overlap, per overlapping
    // step (Price).
    double inverse_life;
  };
  std::vector<std::vector<InFlight>> in_flight_;  // [K] in dispatch order
  std::unordered_map<int64_t, size_t> position_;  // ticket → its index in in_flight_[its decoder]
  int64_t next_ticket_ = 0;
  size_t Record(const RoutingDecision& d) const;  // index of d's record in in_flight_[d.decoder]
  std::mt19937_64 rng_;
  int64_t round_robin_next_ = 0;
};

}  // namespace eldr
