#include "runtime/router/router.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "runtime/common/check.h"

namespace eldr {

const char* RoutingPolicyName(RoutingPolicy p) {
  switch (p) {
    case RoutingPolicy::kRandom:
      return "random";
    case RoutingPolicy::kRoundRobin:
      return "round_robin";
    case RoutingPolicy::kJsq:
      return "jsq";
    case RoutingPolicy::kP2c:
      return "p2c";
    case RoutingPolicy::kDomain:
      return "domain";
    case RoutingPolicy::kLocalityTop1:
      return "locality_top1";
    case RoutingPolicy::kEldr:
      return "eldr";
    case RoutingPolicy::kEldrPaper:
      return "eldr_paper";
    case RoutingPolicy::kEldrTail:
      return "eldr_tail";
  }
  return "unknown";
}

std::vector<RoutingPolicy> AllRoutingPolicies() {
  return {RoutingPolicy::kRandom, RoutingPolicy::kRoundRobin, RoutingPolicy::kJsq,
          RoutingPolicy::kP2c,    RoutingPolicy::kDomain,     RoutingPolicy::kLocalityTop1,
          RoutingPolicy::kEldr,   RoutingPolicy::kEldrPaper,  RoutingPolicy::kEldrTail};
}

Result<RoutingPolicy> ParseRoutingPolicy(const std::string& name) {
  for (auto p : AllRoutingPolicies()) {
    if (name == RoutingPolicyName(p)) return p;
  }
  return Status::InvalidArgument(
      "unknown routing policy '" + name +
      "' (expected random, round_robin, jsq, p2c, domain, locality_top1, eldr, eldr_paper or eldr_tail)");
}

bool UsesSignature(RoutingPolicy p) {
  return p == RoutingPolicy::kEldr || p == RoutingPolicy::kEldrPaper || p == RoutingPolicy::kEldrTail ||
         p == RoutingPolicy::kLocalityTop1;
}

PolicySettings SettingsOf(RoutingPolicy p) {
  PolicySettings s;
  s.calibration = UsesSignature(p);
  s.tau = p == RoutingPolicy::kEldrPaper || p == RoutingPolicy::kEldrTail;
  s.load_bound = UsesSignature(p);
  s.harm_weight = p == RoutingPolicy::kEldr;
  s.step_cost = p == RoutingPolicy::kEldr;
  return s;
}

namespace {

// Least-loaded decoder among `candidates` (all decoders when null) that is eligible (or any, when
// require_eligible is false). Ties → lower index. -1 when none.
int LeastLoaded(const std::vector<DecoderState>& d, const std::vector<int>* candidates, bool require_eligible) {
  int best = -1;
  auto consider = [&](int k) {
    if (require_eligible && !d[k].eligible()) return;
    if (best < 0 || d[k].in_flight < d[best].in_flight || (d[k].in_flight == d[best].in_flight && k < best)) best = k;
  };
  if (candidates) {
    for (int k : *candidates) consider(k);
  } else {
    for (int k = 0; k < static_cast<int>(d.size()); ++k) consider(k);
  }
  return best;
}

// The work bound of eldr_tail and eldr (see Decide in router.h): (1+ε)·(Σ_k w_k + w_r)/K; a decoder is under it
// iff its work is below it.
double WorkCap(const DecisionInputs& in, double eps) {
  double total = in.request_work;
  for (const DecoderState& s : *in.decoders) total += s.work;
  return (1.0 + eps) * total / static_cast<double>(in.decoders->size());
}

// The count bound of the bounded-load band and eldr_tail: ceil((1+ε)·(Σ_k in_flight_k + 1)/K); a decoder is under
// it iff it holds fewer requests. Saturates at INT64_MAX (a huge ε: no bound) instead of overflowing the cast.
int64_t CountCap(const std::vector<DecoderState>& d, double eps) {
  int64_t total = 1;
  for (const DecoderState& s : d) total += s.in_flight;
  const double cap = std::ceil((1.0 + eps) * static_cast<double>(total) / static_cast<double>(d.size()));
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  return cap >= static_cast<double>(kMax) ? kMax : static_cast<int64_t>(cap);
}

RoutingDecision Band(const DecisionInputs& in, double tau) {
  const auto& d = *in.decoders;
  const int K = static_cast<int>(d.size());
  double dmin = std::numeric_limits<double>::infinity();
  for (int k = 0; k < K; ++k) dmin = std::min(dmin, in.distances[k]);
  RoutingDecision out;
  const double bound = dmin + tau;
  // Bounded load (off when load_bound <= 0): a band member already holding ceil((1+ε)·(Σ in_flight + 1)/K)
  // requests is passed over, so a band of one decoder cannot pile up work while the others idle.
  const int64_t load_cap = in.load_bound > 0 ? CountCap(d, in.load_bound) : std::numeric_limits<int64_t>::max();
  int best = -1;
  for (int k = 0; k < K; ++k) {
    if (!(in.distances[k] <= bound)) continue;
    ++out.band_size;
    if (!d[k].eligible() || d[k].in_flight >= load_cap) continue;
    if (best < 0 || d[k].in_flight < d[best].in_flight ||
        (d[k].in_flight == d[best].in_flight && in.distances[k] < in.distances[best])) {
      best = k;  // equal load and equal distance keeps the lower index (scan order)
    }
  }
  if (best < 0) {
    out.fallback = true;
    best = LeastLoaded(d, nullptr, true);  // -1 when every decoder is at its cap
  }
  out.decoder = best;
  out.distance = best >= 0 ? in.distances[best] : 0.0;
  return out;
}

int Nearest(const double* distances, int K) {
  int best = 0;
  for (int k = 1; k < K; ++k) {
    if (distances[k] < distances[best]) best = k;
  }
  return best;
}

// eldr_tail (see Decide in router.h).
RoutingDecision TailBand(const DecisionInputs& in) {
  const auto& d = *in.decoders;
  const int K = static_cast<int>(d.size());
  const double eps = RoutedLoadBound(RoutingPolicy::kEldrTail, in.load_bound);
  const double work_cap = WorkCap(in, eps);
  const int64_t count_cap = CountCap(d, eps);
  auto ok = [&](int k) { return d[k].eligible() && d[k].work < work_cap && d[k].in_flight < count_cap; };
  RoutingDecision out;
  out.nearest = Nearest(in.distances, K);
  out.predicted_tokens = in.request_work;
  const double bound = in.distances[out.nearest] + in.tau;
  int best = -1;
  for (int k = 0; k < K; ++k) {
    if (!(in.distances[k] <= bound)) continue;
    ++out.band_size;
    if (!ok(k)) continue;
    if (best < 0 || d[k].work < d[best].work || (d[k].work == d[best].work && in.distances[k] < in.distances[best])) {
      best = k;
    }
  }
  if (best < 0) {
    // Overflow keeps locality: the nearest centroid's decoder under the bounds, in ascending (d_k, k).
    out.fallback = true;
    for (int k = 0; k < K; ++k) {
      if (!ok(k)) continue;
      if (best < 0 || in.distances[k] < in.distances[best]) best = k;
    }
    out.overflow = best >= 0;
  }
  if (best < 0) {
    // No eligible decoder is under both bounds: the least overloaded one, max(w_k / work cap, n_k / count cap).
    auto over = [&](int k) {
      return std::max(d[k].work / work_cap, static_cast<double>(d[k].in_flight) / static_cast<double>(count_cap));
    };
    for (int k = 0; k < K; ++k) {
      if (d[k].eligible() && (best < 0 || over(k) < over(best))) best = k;
    }
  }
  out.decoder = best;
  out.distance = best >= 0 ? in.distances[best] : 0.0;
  return out;
}

// eldr, the marginal-cost rule (see Decide in router.h).
RoutingDecision CheapestDecoder(const DecisionInputs& in) {
  const auto& d = *in.decoders;
  const int K = static_cast<int>(d.size());
  RoutingDecision out;
  out.nearest = Nearest(in.distances, K);
  out.predicted_tokens = in.request_work;
  // A full decoder (in_flight >= max_batch) would queue the request: second choice, whatever its price; among
  // full ones the shortest queue first.
  auto full = [&](int k) { return in.max_batch > 0 && d[k].in_flight >= in.max_batch; };
  // With load_bound ε > 0, a decoder whose predicted work reaches (1+ε)·(Σ_j w_j + w_r)/K is a second choice too
  // (after the under-bound ones, before the full ones); the least-loaded decoder is always under it.
  const double cap = in.load_bound > 0 ? WorkCap(in, in.load_bound) : std::numeric_limits<double>::infinity();
  auto tier = [&](int k) { return full(k) ? 2 : d[k].work >= cap ? 1 : 0; };
  auto better = [&](int k, int b) {
    if (tier(k) != tier(b)) return tier(k) < tier(b);
    if (full(k) && d[k].in_flight != d[b].in_flight) return d[k].in_flight < d[b].in_flight;
    const double c = in.marginal_cost[k], cb = in.marginal_cost[b];
    return c < cb || (c == cb && in.distances[k] < in.distances[b]);
  };
  int best = -1;
  for (int k = 0; k < K; ++k) {
    if (d[k].eligible() && (best < 0 || better(k, best))) best = k;
  }
  out.decoder = best;
  out.fallback = best < 0;
  out.distance = best >= 0 ? in.distances[best] : 0.0;
  out.predicted_cost = best >= 0 ? in.marginal_cost[best] : 0.0;
  return out;
}

}  // namespace

RoutingDecision Decide(const DecisionInputs& in) {
  ELDR_CHECK(in.decoders && !in.decoders->empty(), "Decide needs at least one decoder");
  const auto& d = *in.decoders;
  const int K = static_cast<int>(d.size());
  RoutingDecision out;
  std::vector<int> eligible;
  switch (in.policy) {
    case RoutingPolicy::kEldrPaper: {
      ELDR_CHECK(in.distances, "eldr_paper routing needs distances");
      RoutingDecision b = Band(in, in.tau);
      b.nearest = Nearest(in.distances, K);
      return b;
    }
    case RoutingPolicy::kEldrTail:
      ELDR_CHECK(in.distances, "eldr_tail routing needs distances");
      ELDR_CHECK(in.request_work > 0, "eldr_tail needs a request work > 0");
      return TailBand(in);
    case RoutingPolicy::kEldr:
      ELDR_CHECK(in.distances && in.marginal_cost, "eldr routing needs distances and marginal costs");
      return CheapestDecoder(in);
    case RoutingPolicy::kLocalityTop1:
      ELDR_CHECK(in.distances, "locality_top1 routing needs distances");
      return Band(in, 0.0);
    case RoutingPolicy::kJsq:
      out.decoder = LeastLoaded(d, nullptr, true);
      break;
    case RoutingPolicy::kDomain: {
      const std::vector<int>* group = in.domain_group && !in.domain_group->empty() ? in.domain_group : nullptr;
      out.decoder = group ? LeastLoaded(d, group, true) : -1;
      if (out.decoder < 0) out.decoder = LeastLoaded(d, nullptr, true);
      break;
    }
    case RoutingPolicy::kRandom:
    case RoutingPolicy::kP2c:
    case RoutingPolicy::kRoundRobin: {
      for (int k = 0; k < K; ++k) {
        if (d[k].eligible()) eligible.push_back(k);
      }
      if (eligible.empty()) break;
      const uint64_t n = eligible.size();
      if (in.policy == RoutingPolicy::kRandom) {
        out.decoder = eligible[in.random_a % n];
      } else if (in.policy == RoutingPolicy::kRoundRobin) {
        // The first eligible decoder at or after the counter position (cyclically).
        const int start = static_cast<int>(((in.round_robin_next % K) + K) % K);
        for (int i = 0; i < K; ++i) {
          const int k = (start + i) % K;
          if (d[k].eligible()) {
            out.decoder = k;
            break;
          }
        }
      } else {
        int a = eligible[in.random_a % n];
        int b = a;
        if (n > 1) {
          // b uniform over the other n-1 eligible decoders.
          const uint64_t j = in.random_b % (n - 1);
          const uint64_t ia = in.random_a % n;
          b = eligible[j < ia ? j : j + 1];
        }
        if (d[b].in_flight < d[a].in_flight || (d[b].in_flight == d[a].in_flight && b < a)) std::swap(a, b);
        out.decoder = a;
      }
      break;
    }
  }
  if (out.decoder < 0) out.fallback = true;  // every decoder at its cap: the request waits at the router
  return out;
}

double RoutedLoadBound(RoutingPolicy policy, std::optional<double> load_bound) {
  if (!load_bound) return DefaultLoadBound(policy);
  return policy == RoutingPolicy::kEldrTail && *load_bound == 0 ? kTailLoadBound : *load_bound;
}

double DefaultLoadBound(RoutingPolicy policy) {
  switch (policy) {
    case RoutingPolicy::kEldrTail:
      return kTailLoadBound;
    default:
      return 0.0;
  }
}

Result<Router> Router::Create(const RouterConfig& config, const Calibration* calib) {
  if (config.num_decoders < 1) {
    return Status::InvalidArgument("the job needs at least one decoder, got " + std::to_string(config.num_decoders));
  }
  if (config.admission_cap < 0) return Status::InvalidArgument("admission cap must be >= 0");
  if (config.tokens_at_routing < 0) return Status::InvalidArgument("tokens_at_routing must be >= 0");
  if (config.load_bound && !(*config.load_bound >= 0)) {
    return Status::InvalidArgument("load_bound must be >= 0 (0 = off)");
  }
  Router r;
  r.config_ = config;
  r.config_.load_bound = RoutedLoadBound(config.policy, config.load_bound);
  r.decoders_.assign(config.num_decoders, DecoderState{0, config.admission_cap});
  r.in_flight_.assign(config.num_decoders, {});
  r.rng_.seed(config.seed);
  if (calib) {
    if (config.job_shape.num_layers <= 0) {
      return Status::InvalidArgument("the job's model shape is needed to check the calibration against it");
    }
    if (!config.job_shape.SameAs(calib->shape)) {
      return Status::FailedPrecondition("calibration is for model shape " + calib->shape.ToString() +
                                        " but the job's model is " + config.job_shape.ToString());
    }
    if (calib->num_clusters != config.num_decoders) {
      return Status::FailedPrecondition("calibration has K = " + std::to_string(calib->num_clusters) +
                                        " centroids but the job has " + std::to_string(config.num_decoders) +
                                        " decoders; re-cluster with 'eldr calibrate --refit CALIB --decoders " +
                                        std::to_string(config.num_decoders) + "'");
    }
    r.params_ = calib->signature;
    // Route's prompt length comes from the first masked layer's counts (the only ones the simulator's prefill
    // sums); no masked layer: layer 0.
    const std::vector<uint8_t>& mask = r.params_.layer_mask;
    const auto first = std::find_if(mask.begin(), mask.end(), [](uint8_t m) { return m != 0; });
    r.context_layer_ = first == mask.end() ? 0 : static_cast<int>(first - mask.begin());
    if (calib->centroids.size() != static_cast<size_t>(calib->num_clusters) * calib->signature.dim()) {
      return Status::FailedPrecondition("calibration centroids are not [K, D] = [" +
                                        std::to_string(calib->num_clusters) + ", " +
                                        std::to_string(calib->signature.dim()) + "]");
    }
    r.centroids_ = CentroidMatrix(calib->centroids, calib->num_clusters, calib->signature.dim());
    r.lengths_ = DecodeLengthPrior(calib->decode_lens, calib->assignment, calib->num_clusters, calib->mean_decode_len);
    if (config.policy == RoutingPolicy::kEldr) {
      if (!config.step_cost) {
        return Status::InvalidArgument("routing policy eldr needs a decode cost model (routing.cost_model)");
      }
      if (config.max_batch < 1) return Status::InvalidArgument("eldr routing needs max_batch >= 1");
      if (!(config.harm_weight >= 0 && config.harm_weight <= 1)) {
        return Status::InvalidArgument("routing.harm_weight must be in [0, 1]");
      }
      const TraceShape& sh = calib->shape;
      if (calib->expert_load.size() != static_cast<size_t>(calib->num_clusters) * sh.num_layers * sh.num_experts) {
        return Status::FailedPrecondition(
            "routing policy eldr needs the calibration's /clusters/expert_load; re-run 'eldr calibrate'");
      }
      r.union_ = PredictedUnion(calib->expert_load, calib->num_clusters, calib->signature.layer_mask, sh.num_layers,
                                sh.num_experts, config.num_decoders);
      r.context_.assign(config.num_decoders, 0.0);
    }
    if (!config.tau) r.config_.tau = calib->tau;
  } else if (UsesSignature(config.policy)) {
    return Status::InvalidArgument(std::string("routing policy ") + RoutingPolicyName(config.policy) +
                                   " needs a calibration file (centroids, IDF, layer mask)");
  } else if (!config.tau) {
    r.config_.tau = 0.1;  // no calibration to take it from: DESIGN.md's default (unused by load-only policies)
  }
  if (!(*r.config_.tau >= 0) || !std::isfinite(*r.config_.tau)) {
    return Status::InvalidArgument("tau must be a finite value >= 0");
  }
  std::vector<std::string> labels = config.domains;
  if (labels.empty() && calib) labels = calib->domains;
  std::set<std::string> uniq;
  for (const auto& l : labels) {
    if (!l.empty()) uniq.insert(l);
  }
  if (config.policy == RoutingPolicy::kDomain && uniq.empty()) {
    return Status::InvalidArgument("routing policy domain needs domain labels (the trace's requests have none)");
  }
  // Domain i of M (sorted labels) → decoders {k : k mod M = i} when K >= M, else decoder i mod K.
  const int M = static_cast<int>(uniq.size()), K = config.num_decoders;
  int i = 0;
  for (const auto& label : uniq) {
    std::vector<int> group;
    if (K >= M) {
      for (int k = i; k < K; k += M) group.push_back(k);
    } else {
      group.push_back(i % K);
    }
    r.domain_groups_[label] = group;
    ++i;
  }
  r.distances_.assign(K, 0.0);
  r.dots_.assign(K, 0.f);
  r.signature_.assign(r.params_.dim(), 0.f);
  return r;
}

const std::vector<int>* Router::DomainGroup(const std::string& domain) const {
  auto it = domain_groups_.find(domain);
  return it == domain_groups_.end() ? nullptr : &it->second;
}

RoutingDecision Router::DecideNow(const double* distances, const std::string& domain, double context) {
  DecisionInputs in;
  in.policy = config_.policy;
  in.decoders = &decoders_;
  in.distances = distances;
  in.tau = *config_.tau;
  in.load_bound = *config_.load_bound;
  in.domain_group = config_.policy == RoutingPolicy::kDomain ? DomainGroup(domain) : nullptr;
  if (config_.policy == RoutingPolicy::kRandom || config_.policy == RoutingPolicy::kP2c) {
    in.random_a = rng_();
    in.random_b = rng_();
  }
  in.round_robin_next = round_robin_next_;
  const int nearest = distances ? Nearest(distances, config_.num_decoders) : -1;
  if (distances) in.request_work = PriorDecodeTokens(nearest);
  if (config_.policy == RoutingPolicy::kEldr) {
    // The request's profile is its cluster's, so the growths come from the per-(cluster, decoder) cache: the same
    // values as MarginalCost's, recomputed only for the decoders changed since this cluster's last decision.
    costs_.resize(config_.num_decoders);
    const double* growth = union_.Growths(nearest);
    for (int k = 0; k < config_.num_decoders; ++k) costs_[k] = Price(k, growth[k], context, in.request_work);
    in.marginal_cost = costs_.data();
    in.max_batch = config_.max_batch;
  }
  RoutingDecision out = Decide(in);
  out.context = context;
  if (config_.policy == RoutingPolicy::kRoundRobin && out.decoder >= 0) round_robin_next_ = out.decoder + 1;
  out.ticket = next_ticket_++;
  return out;
}

RoutingDecision Router::RouteSignature(const float* signature, const std::string& domain) {
  return RouteSignature(signature, domain, 0.0);
}

RoutingDecision Router::RouteSignature(const float* signature, const std::string& domain, double context) {
  if (!UsesSignature(config_.policy)) return DecideNow(nullptr, domain, context);
  const int K = config_.num_decoders;
  // d_k = 1 − ŝ·μ̂_k with ŝ, μ̂ in 16-bit fixed point (CentroidMatrix: half the bytes of float, exact integer sums).
  centroids_.Dots(signature, dots_.data(), &quantised_signature_);
  for (int k = 0; k < K; ++k) distances_[k] = 1.0 - static_cast<double>(dots_[k]);
  return DecideNow(distances_.data(), domain, context);
}

RoutingDecision Router::Route(const float* counts, const float* gate_sums, const std::string& domain) {
  // Prompt tokens: every token adds top_k to each layer's counts. Counts may hold the masked layers only (the
  // simulator's prefill sums those alone, SignatureCache::SumCounts with the signature's mask), so read the first
  // masked layer (context_layer_): layer 0, which the mask may leave out, read as a context of 0 there.
  double context = 0;
  const int E = config_.job_shape.num_experts, k = config_.job_shape.top_k;
  if (counts && E > 0 && k > 0) {
    for (int e = 0; e < E; ++e) context += counts[static_cast<size_t>(context_layer_) * E + e];
    context /= k;
  }
  if (!UsesSignature(config_.policy)) return DecideNow(nullptr, domain, context);
  ComputeSignature(params_, counts, gate_sums, signature_.data());
  return RouteSignature(signature_.data(), domain, context);
}

double Router::MarginalCost(int k, int profile, double context, double tokens) const {
  ELDR_CHECK(config_.policy == RoutingPolicy::kEldr && config_.step_cost, "MarginalCost needs policy eldr");
  return Price(k, profile >= 0 ? union_.Growth(k, profile) : 0.0, context, tokens);
}

// One out-of-line copy: GCC contracts a·b + c into FMAs per inlined copy, so MarginalCost and the decision share
// this one and price alike, bit for bit (as when the decision called MarginalCost out of line).
__attribute__((noinline)) double Router::Price(int k, double growth, double context, double tokens) const {
  const CostModel& m = *config_.step_cost;
  const DecoderState& s = decoders_[k];
  const double max_batch = static_cast<double>(config_.max_batch);
  const double in_flight = static_cast<double>(s.in_flight);
  const double running = std::min(in_flight, max_batch);  // the sequences of its next step
  const double own_context = context + tokens / 2;        // its mean context over its decode
  // The request's own step time there.
  const double step = m.DecodeStep(union_.Union(k) + growth, running + 1, context_[k] + own_context);
  // What it adds to the running requests' TPOT: each running request j's steps slow down by `slowdown` for the
  // min(tokens, m_j) steps the two overlap, out of its g_j + m_j decode steps (DESIGN.md §3). Without the
  // calibration's decode lengths, or for a load dispatched without a record, a share of 1: the whole step.
  double share = 0;
  int64_t recorded = 0;
  if (lengths_.has_lengths()) {
    for (const InFlight& j : in_flight_[k]) {
      share += std::min(tokens, j.remaining) * j.inverse_life;
      ++recorded;
    }
  }
  share += in_flight - static_cast<double>(recorded);
  if (in_flight > max_batch) share *= max_batch / in_flight;  // only max_batch of them run
  const double slowdown = m.decode_b * growth + m.decode_c + m.decode_d * own_context;
  return step + config_.harm_weight * share * slowdown;
}

void Router::Dispatch(int decoder, double work) {
  ELDR_CHECK(decoder >= 0 && decoder < static_cast<int>(decoders_.size()), "decoder " << decoder << " out of range");
  ++decoders_[decoder].in_flight;
  decoders_[decoder].work += work;
}

void Router::Dispatch(const RoutingDecision& d) {
  Dispatch(d.decoder, d.predicted_tokens);
  if (d.ticket >= 0) {
    // eldr and eldr_tail route with the cluster's prior; the other policies' requests weigh 1 throughout.
    const bool prior = config_.policy == RoutingPolicy::kEldr || config_.policy == RoutingPolicy::kEldrTail;
    std::vector<InFlight>& list = in_flight_[d.decoder];
    ELDR_CHECK(position_.emplace(d.ticket, list.size()).second, "request " << d.ticket << " dispatched twice");
    list.push_back({d.ticket, prior ? d.nearest : -1, config_.tokens_at_routing, d.predicted_tokens,
                    1 / std::max(1.0, d.predicted_tokens)});
  }
  if (config_.policy != RoutingPolicy::kEldr) return;
  if (d.nearest >= 0) union_.Add(d.decoder, d.nearest);
  context_[d.decoder] += d.context + d.predicted_tokens / 2;
}

void Router::AddWork(int decoder, double delta) {
  ELDR_CHECK(decoder >= 0 && decoder < static_cast<int>(decoders_.size()), "decoder " << decoder << " out of range");
  decoders_[decoder].work = std::max(0.0, decoders_[decoder].work + delta);
}

size_t Router::Record(const RoutingDecision& d) const {
  ELDR_CHECK(d.decoder >= 0 && d.decoder < static_cast<int>(in_flight_.size()), "decoder " << d.decoder);
  const auto it = position_.find(d.ticket);
  ELDR_CHECK(it != position_.end() && in_flight_[d.decoder][it->second].ticket == d.ticket,
             "request " << d.ticket << " is not in flight on decoder " << d.decoder);
  return it->second;
}

void Router::ConsumeToken(const RoutingDecision& d) {
  InFlight& j = in_flight_[d.decoder][Record(d)];
  ++j.generated;
  const double next = lengths_.Remaining(j.cluster, j.generated);
  AddWork(d.decoder, next - j.remaining);
  j.remaining = next;
  // Its TPOT is over its decode steps, the tokens after those it had when routed (serve's prefill token is not one).
  j.inverse_life = 1 / std::max(1.0, static_cast<double>(j.generated - config_.tokens_at_routing) + next);
}

double Router::RemainingTokens(const RoutingDecision& d) const { return in_flight_[d.decoder][Record(d)].remaining; }

void Router::Complete(int decoder, double work_left) {
  ELDR_CHECK(decoder >= 0 && decoder < static_cast<int>(decoders_.size()), "decoder " << decoder << " out of range");
  DecoderState& s = decoders_[decoder];
  ELDR_CHECK(s.in_flight > 0, "decoder " << decoder << " completed more requests than it was sent");
  --s.in_flight;
  // Nothing in flight holds no work: drop the floating-point residue of the additions.
  s.work = s.in_flight == 0 ? 0.0 : std::max(0.0, s.work - work_left);
}

void Router::Complete(const RoutingDecision& d) {
  double work_left = d.predicted_tokens;  // a load without a record (ticket < 0) held its prediction
  if (d.ticket >= 0) {
    std::vector<InFlight>& list = in_flight_[d.decoder];
    const size_t i = Record(d);
    work_left = list[i].remaining;
    // Erase in place (the records keep their order, so the shares are summed in the same order on every run) and
    // move the later records' positions down: O(in flight) once per request, the lookups per token O(1).
    list.erase(list.begin() + static_cast<std::ptrdiff_t>(i));
    position_.erase(d.ticket);
    for (size_t k = i; k < list.size(); ++k) --position_[list[k].ticket];
  }
  Complete(d.decoder, work_left);
  if (config_.policy != RoutingPolicy::kEldr) return;
  if (d.nearest >= 0) union_.Remove(d.decoder, d.nearest);
  double& c = context_[d.decoder];
  c = decoders_[d.decoder].in_flight == 0 ? 0.0 : std::max(0.0, c - d.context - d.predicted_tokens / 2);
}

}  // namespace eldr
