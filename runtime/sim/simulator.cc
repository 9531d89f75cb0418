#include "runtime/sim/simulator.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <deque>
#include <map>
#include <optional>
#include <queue>

#include "runtime/common/distinct_experts.h"
#include "runtime/common/progress.h"
#include "runtime/common/signals.h"
#include "runtime/job/frontend.h"
#include "runtime/job/workload.h"
#include "runtime/kvcache/block_manager.h"
#include "runtime/kvcache/prefill_signature.h"
#include "runtime/kvcache/signature_cache.h"

namespace eldr {

namespace {

enum class EventKind : uint8_t {
  kArrival,         // a = -, b = request: the workload's next arrival is due
  kPrefillEnqueue,  // a = prefill rank, b = request
  kPrefillDone,     // a = prefill rank, b = request
  kCountsAtRouter,  // b = request: first token and counts reach the router
  kFailedAtRouter,  // b = request
  kRouteAtPrefill,  // a = decoder, b = request
  kKvAtDecoder,     // a = decoder, b = request
  kStepStart,       // a = decoder: admission and one step, after every other event of the same instant
  kStepDone,        // a = decoder
  kDoneAtRouter,    // a = decoder, b = request
};

struct Event {
  double time;
  uint64_t seq;
  EventKind kind;
  int32_t a;
  int64_t b;
  uint64_t version = 0;  // kPrefillDone / kStepDone under processor sharing: stale when the work was rescheduled
  bool operator>(const Event& o) const {
    if (time != o.time) return time > o.time;
    const bool late = kind == EventKind::kStepStart, other_late = o.kind == EventKind::kStepStart;
    if (late != other_late) return late;  // a decoder polls every message that has arrived, then steps
    return seq > o.seq;
  }
};

// The decode routing of the trace as per-layer expert bitmasks: row j of a request's decode rows is
// masks[(first_row[r] + j)·L·W + ℓ·W + w]. A request without decode rows uses its last prompt row (as
// serve's RoutingRows does).
struct DecodeMasks {
  int L = 0, W = 0;
  std::vector<int64_t> first_row;  // [trace requests]
  std::vector<int32_t> num_rows;   // [trace requests]
  std::vector<uint64_t> masks;

  static DecodeMasks Build(const Trace& t) {
    DecodeMasks m;
    m.L = t.shape.num_layers;
    m.W = (t.shape.num_experts + 63) / 64;
    const int k = t.shape.top_k;
    int64_t rows = 0;
    for (const auto& r : t.requests) rows += std::max<int64_t>(1, r.decode_len());
    m.masks.assign(static_cast<size_t>(rows) * m.L * m.W, 0);
    int64_t next = 0;
    for (const auto& r : t.requests) {
      m.first_row.push_back(next);
      const int64_t n = std::max<int64_t>(1, r.decode_len());
      m.num_rows.push_back(static_cast<int32_t>(n));
      for (int64_t j = 0; j < n; ++j) {
        const int64_t row = r.decode_len() > 0 ? r.prompt_len + j : r.num_tokens - 1;
        const uint16_t* ids = t.token_ids(r.offset + row);
        TokenExpertSet(ids, m.L, t.shape.num_experts, k, m.masks.data() + static_cast<size_t>(next + j) * m.L * m.W);
      }
      next += n;
    }
    return m;
  }
  // The masks of decode step `step` (0-based) of trace request r.
  const uint64_t* Row(int32_t r, int64_t step) const {
    return masks.data() + static_cast<size_t>(first_row[r] + step % num_rows[r]) * L * W;
  }
};

// The [L, E] expert counts of a trace request's recorded decode tokens: what the router is handed instead of the
// prompt's counts under --route-on decode (JobConfig::route_on_decode).
std::vector<float> DecodeCounts(const Trace& t, const TraceRequest& r) {
  const int L = t.shape.num_layers, E = t.shape.num_experts, k = t.shape.top_k;
  std::vector<float> counts(static_cast<size_t>(L) * E, 0.f);
  for (int64_t row = r.prompt_len; row < r.num_tokens; ++row) {
    const uint16_t* ids = t.token_ids(r.offset + row);
    for (int l = 0; l < L; ++l) {
      for (int j = 0; j < k; ++j) counts[static_cast<size_t>(l) * E + ids[l * k + j]] += 1.f;
    }
  }
  return counts;
}

struct Sequence {
  int64_t request;
  std::vector<BlockId> blocks;
  int64_t produced = 1;  // output tokens so far, prefill's included
};

struct Decoder {
  std::deque<int64_t> queue;
  std::vector<Sequence> running;
  bool stepping = false;  // a step is running or about to start
  BlockManager blocks;
  explicit Decoder(int num_blocks, int block_size) : blocks(num_blocks, block_size) {}
};

struct PrefillRank {
  std::deque<int64_t> queue;
  bool busy = false;
  BlockManager blocks;
  SignatureCache signatures;
  PrefillRank(int num_blocks, int block_size, int L, int E)
      : blocks(num_blocks, block_size), signatures(num_blocks, L, E, block_size) {
    AttachSignatureCache(blocks, signatures);
  }
};

class Simulation {
 public:
  Simulation(const JobConfig& c, const JobRequests& in, const ModelConfig& mc, const CostModel& cost)
      : c_(c), in_(in), mc_(mc), cost_(cost), N_(in.size()) {}

  Result<SimulationResult> Run(const Calibration* calib, bool progress) {
    ELDR_RETURN_IF_ERROR(Setup(calib));
    ProgressBar bar("simulating " + std::string(RoutingPolicyName(c_.policy)), N_, progress);
    if (N_ > 0) Push(frontend_->arrivals()[0], EventKind::kArrival, 0, 0);
    while (!events_.empty()) {
      const Event e = events_.top();
      events_.pop();
      now_ = e.time;
      ++result_.events;
      if ((result_.events & 4095) == 0 && Interrupted()) return InterruptStatus();
      ELDR_RETURN_IF_ERROR(Handle(e));
      const int64_t done = frontend_->num_done();
      if ((done & 255) == 0 || done == N_) bar.Update(done);
    }
    bar.Finish();
    if (!frontend_->done()) {
      return Status::FailedPrecondition("internal: simulation ended with " +
                                        std::to_string(N_ - frontend_->num_done()) + " of " + std::to_string(N_) +
                                        " requests unaccounted for");
    }
    result_.simulated_seconds = now_;
    result_.routing = frontend_->routing();
    result_.decoders = frontend_->DecoderStatistics();
    result_.records = frontend_->TakeRecords();
    return std::move(result_);
  }

 private:
  // The frontend (its router and arrivals), the trace's decode routing, the workers.
  Status Setup(const Calibration* calib) {
    // One process holds every rank's block tables (and, at the router, every token's latency): checked whole.
    const double prefill_block =
        BlockManager::MemoryBytes(1, c_.block_size, true) +
        SignatureCache::MemoryBytes(1, in_.trace.shape.num_layers, in_.trace.shape.num_experts);
    ELDR_RETURN_IF_ERROR(
        CheckJobMemory({{c_.Key("kv_cache.prefill_blocks") + " = " + std::to_string(c_.prefill_blocks) + " on " +
                             std::to_string(c_.prefill_ranks) + " prefill ranks",
                         prefill_block * c_.prefill_blocks * c_.prefill_ranks},
                        {c_.Key("kv_cache.decode_blocks") + " = " + std::to_string(c_.decode_blocks) + " on " +
                             std::to_string(c_.decode_ranks) + " decoders",
                         BlockManager::MemoryBytes(c_.decode_blocks, c_.block_size, false) * c_.decode_ranks},
                        OutputTokenMemory(c_, in_)}));
    FrontendActions actions;
    actions.send_to_prefill = [this](int64_t i, int p) {
      Push(now_ + cost_.control_latency, EventKind::kPrefillEnqueue, p, i);
    };
    actions.send_route = [this](int64_t i, int d) {
      Push(now_ + cost_.control_latency, EventKind::kRouteAtPrefill, d, i);
    };
    ELDR_ASSIGN_OR_RETURN(Frontend f, Frontend::Create(c_, in_, mc_.trace_shape(), calib, std::move(actions), &cost_));
    frontend_.emplace(std::move(f));
    masks_ = DecodeMasks::Build(in_.trace);
    domains_ = in_.trace.Domains();
    const int L = in_.trace.shape.num_layers, E = in_.trace.shape.num_experts;
    if (UsesSignature(c_.policy) && calib) {
      count_mask_ = calib->signature.layer_mask;
    } else {
      count_mask_.assign(L, 0);  // load-only policies need no counts
    }
    kv_bytes_per_token_ = 2.0 * mc_.num_hidden_layers * mc_.num_key_value_heads * mc_.head_dim *
                          (mc_.torch_dtype == "bfloat16" ? 2.0 : 4.0);
    for (int p = 0; p < c_.prefill_ranks; ++p) prefill_.emplace_back(c_.prefill_blocks, c_.block_size, L, E);
    for (int d = 0; d < c_.decode_ranks; ++d) decoders_.emplace_back(c_.decode_blocks, c_.block_size);
    counts_.resize(N_);
    allocations_.resize(N_);
    step_experts_ = ExpertUnion(masks_.L, in_.trace.shape.num_experts);
    return Status::Ok();
  }

  void Push(double t, EventKind kind, int32_t a, int64_t b, uint64_t version = 0) {
    events_.push({t, seq_++, kind, a, b, version});
  }

  // Work (a prefill or a decode step) of `seconds` on a dedicated core. With a device per worker
  // (cost_.cores == 0) it ends `seconds` from now. With shared cores it joins the processor-sharing pool:
  // while n works run, each progresses at min(1, cores / n); every start and end reschedules the others'
  // end events (older ones become stale by version).
  struct Work {
    EventKind done;  // kPrefillDone or kStepDone
    int32_t worker;
    int64_t request;
    double remaining;  // seconds of dedicated-core work left
    uint64_t version;
  };
  void BeginWork(double seconds, EventKind done, int32_t worker, int64_t request) {
    if (cost_.cores <= 0) {
      Push(now_ + seconds, done, worker, request);
      return;
    }
    AdvanceWork();
    working_.push_back({done, worker, request, seconds, 0});
    RescheduleWork();
  }
  // True when `e` is the current end of its work (always, without sharing); removes it from the pool.
  bool EndWork(const Event& e) {
    if (cost_.cores <= 0) return true;
    auto it = std::find_if(working_.begin(), working_.end(),
                           [&](const Work& w) { return w.done == e.kind && w.worker == e.a; });
    if (it == working_.end() || it->version != e.version) return false;  // rescheduled since
    AdvanceWork();
    working_.erase(it);
    RescheduleWork();
    return true;
  }
  double ShareRate() const {
    return working_.empty() ? 1.0 : std::min(1.0, cost_.cores / static_cast<double>(working_.size()));
  }
  void AdvanceWork() {
    const double progress = ShareRate() * (now_ - work_clock_);
    for (Work& w : working_) w.remaining = std::max(0.0, w.remaining - progress);
    work_clock_ = now_;
  }
  void RescheduleWork() {
    const double rate = ShareRate();
    for (Work& w : working_) {
      w.version = ++work_version_;
      Push(now_ + w.remaining / rate, w.done, w.worker, w.request, w.version);
    }
  }

  Status Handle(const Event& e) {
    switch (e.kind) {
      case EventKind::kArrival:
        arrival_due_ = e.b + 1;
        frontend_->Admit(arrival_due_, now_);
        if (arrival_due_ < N_) Push(frontend_->arrivals()[arrival_due_], EventKind::kArrival, 0, arrival_due_);
        return Status::Ok();
      case EventKind::kPrefillEnqueue:
        prefill_[e.a].queue.push_back(e.b);
        return StartPrefill(e.a);
      case EventKind::kPrefillDone:
        if (!EndWork(e)) return Status::Ok();
        return PrefillDone(e.a, e.b);
      case EventKind::kCountsAtRouter:
        frontend_->OnFirstToken(e.b, now_, std::nullopt, std::move(counts_[e.b]));
        frontend_->Admit(arrival_due_, now_);  // its prefill rank has room for one more (Frontend::kPrefillQueue)
        return Status::Ok();
      case EventKind::kFailedAtRouter:
        Finish(e.b, false);
        return Status::Ok();
      case EventKind::kRouteAtPrefill:
        return RouteAtPrefill(e.a, e.b);
      case EventKind::kKvAtDecoder:
        KvAtDecoder(e.a, e.b);
        return Status::Ok();
      case EventKind::kStepStart:
        StartStep(e.a);
        return Status::Ok();
      case EventKind::kStepDone:
        if (EndWork(e)) StepDone(e.a);
        return Status::Ok();
      case EventKind::kDoneAtRouter:
        Finish(e.b, true);
        return Status::Ok();
    }
    return Status::Ok();
  }

  Status StartPrefill(int p) {
    PrefillRank& pr = prefill_[p];
    if (pr.busy || pr.queue.empty()) return Status::Ok();
    const int64_t i = pr.queue.front();
    const TraceRequest& r = in_.request(i);
    const std::vector<int32_t> tokens = PromptTokens(r, domains_, mc_.vocab_size);
    auto alloc = PrefillPrompt(pr.blocks, pr.signatures, tokens, in_.trace.token_ids(r.offset), masks_.L,
                               in_.trace.shape.top_k, &count_mask_);
    if (!alloc.ok()) {
      const int64_t need = (r.prompt_len + c_.block_size - 1) / c_.block_size;
      if (need <= c_.prefill_blocks) return Status::Ok();  // waits, head of line, for shipped requests' blocks
      pr.queue.pop_front();
      errors_[i] = "prefill " + std::to_string(p) + ": prompt of " + std::to_string(r.prompt_len) +
                   " tokens exceeds the prefill KV cache";
      Push(now_ + cost_.control_latency, EventKind::kFailedAtRouter, p, i);
      return StartPrefill(p);
    }
    pr.queue.pop_front();
    const int cached = alloc->allocation.num_cached_tokens();
    const int64_t from = std::min<int64_t>(cached, r.prompt_len - 1);  // a full hit recomputes the last token
    allocations_[i] = std::move(alloc->allocation.blocks);
    counts_[i] = c_.route_on_decode ? DecodeCounts(in_.trace, r) : std::move(alloc->counts);
    pr.busy = true;
    BeginWork(cost_.Prefill(static_cast<double>(r.prompt_len - from)), EventKind::kPrefillDone, p, i);
    return Status::Ok();
  }

  Status PrefillDone(int p, int64_t i) {
    prefill_[p].busy = false;
    Push(now_ + cost_.control_latency, EventKind::kCountsAtRouter, p, i);
    return StartPrefill(p);
  }

  Status RouteAtPrefill(int d, int64_t i) {
    const int p = frontend_->prefill_of(i);
    const double bytes = kv_bytes_per_token_ * static_cast<double>(in_.request(i).prompt_len);
    Push(now_ + cost_.KvTransfer(bytes), EventKind::kKvAtDecoder, d, i);
    prefill_[p].blocks.Free(allocations_[i]);
    std::vector<BlockId>().swap(allocations_[i]);
    return StartPrefill(p);  // a prompt waiting for blocks may fit now
  }

  // The positions a decoder writes, prompt + output − 1 (the last output token is never an input), as serve's
  // decode worker allocates them and the workload check (runtime/job/workload.cc) counts them.
  int64_t ContextTokens(int64_t i) const {
    return std::max<int64_t>(1, in_.request(i).prompt_len + in_.output_len[i] - 1);
  }
  int ContextBlocks(int64_t i) const {
    return static_cast<int>((ContextTokens(i) + c_.block_size - 1) / c_.block_size);
  }

  void KvAtDecoder(int d, int64_t i) {
    if (ContextBlocks(i) > c_.decode_blocks) {
      errors_[i] = "decode " + std::to_string(d) + ": context of " + std::to_string(ContextTokens(i)) +
                   " tokens exceeds the decode KV cache";
      Push(now_ + cost_.control_latency, EventKind::kFailedAtRouter, d, i);
      return;
    }
    decoders_[d].queue.push_back(i);
    if (!decoders_[d].stepping) {
      decoders_[d].stepping = true;
      Push(now_, EventKind::kStepStart, d, 0);
    }
  }

  // Admission and one decode step (DecodeWorker::Step).
  void StartStep(int d) {
    Decoder& dec = decoders_[d];
    while (!dec.queue.empty() && static_cast<int>(dec.running.size()) < c_.max_batch) {
      const int64_t i = dec.queue.front();
      const int need = ContextBlocks(i);
      if (!dec.blocks.CanAllocate(need)) break;
      dec.queue.pop_front();
      auto blocks = dec.blocks.AllocateBlocks(need);
      if (in_.output_len[i] <= 1) {  // prefill's token was the only one
        dec.blocks.Free(*blocks);
        Push(now_ + cost_.control_latency, EventKind::kDoneAtRouter, d, i);
        continue;
      }
      dec.running.push_back({i, std::move(*blocks), 1});
    }
    if (dec.running.empty()) {
      dec.stepping = false;
      return;
    }
    step_experts_.Clear();
    int64_t context = 0;
    for (const Sequence& s : dec.running) {
      step_experts_.AddTokenSet(masks_.Row(in_.order[s.request], s.produced - 1));
      context += in_.request(s.request).prompt_len + s.produced;
    }
    const int64_t distinct = step_experts_.Total();
    frontend_->OnDecodeStep(d, static_cast<int64_t>(dec.running.size()), distinct, {}, 0.0);
    dec.stepping = true;
    BeginWork(cost_.DecodeStep(static_cast<double>(distinct), static_cast<double>(dec.running.size()),
                               static_cast<double>(context)),
              EventKind::kStepDone, d, 0);
  }

  void StepDone(int d) {
    Decoder& dec = decoders_[d];
    const double at_frontend = now_ + cost_.control_latency;
    size_t kept = 0;
    for (size_t x = 0; x < dec.running.size(); ++x) {
      Sequence& s = dec.running[x];
      frontend_->OnToken(s.request, at_frontend, std::nullopt);
      if (++s.produced >= in_.output_len[s.request]) {
        dec.blocks.Free(s.blocks);
        Push(at_frontend, EventKind::kDoneAtRouter, d, s.request);
      } else {
        if (kept != x) dec.running[kept] = std::move(s);
        ++kept;
      }
    }
    dec.running.resize(kept);
    Push(now_, EventKind::kStepStart, d, 0);
  }

  // The request's end reached the frontend: its decoder's slot frees (held requests may route), and arrivals
  // that max_concurrency held may go.
  void Finish(int64_t i, bool ok) {
    std::string error;
    if (auto it = errors_.find(i); it != errors_.end()) {
      error = std::move(it->second);
      errors_.erase(it);
    }
    frontend_->Finish(i, now_, ok, error);
    frontend_->Admit(arrival_due_, now_);
  }

  const JobConfig& c_;
  const JobRequests& in_;
  const ModelConfig& mc_;
  const CostModel& cost_;
  const int64_t N_;

  std::optional<Frontend> frontend_;
  DecodeMasks masks_;
  std::vector<std::string> domains_;
  std::vector<uint8_t> count_mask_;
  double kv_bytes_per_token_ = 0;
  std::deque<PrefillRank> prefill_;  // a deque: its elements never move (the block manager's eviction
                                     // callback points at the rank's signature cache)
  std::vector<Decoder> decoders_;
  std::vector<std::vector<float>> counts_;         // per request, from its prefill until moved to the frontend
  std::vector<std::vector<BlockId>> allocations_;  // per request, its prefill blocks until the KV ships
  std::map<int64_t, std::string> errors_;          // failed requests, until their failure reaches the frontend
  ExpertUnion step_experts_{0, 1};                 // the experts of the decode step being formed

  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  uint64_t seq_ = 0;
  double now_ = 0;
  int64_t arrival_due_ = 0;    // requests whose arrival event has passed
  std::vector<Work> working_;  // shared cores only: the works in progress
  double work_clock_ = 0;      // when working_'s remaining times were last brought up to date
  uint64_t work_version_ = 0;
  SimulationResult result_;
};

}  // namespace

Result<SimulationResult> Simulate(const JobConfig& c, const JobRequests& in, const ModelConfig& mc,
                                  const Calibration* calib, const CostModel& cost, bool progress) {
  if (!mc.trace_shape().SameAs(in.trace.shape)) {
    return Status::FailedPrecondition(c.trace + ": routing shape " + in.trace.shape.ToString() +
                                      " differs from the model " + c.model_config + " (" + mc.trace_shape().ToString() +
                                      ")");
  }
  if (c.ep_size > 1) {
    return Status::InvalidArgument(c.path + ": decode.ep_size " + std::to_string(c.ep_size) +
                                   ": eldr simulate does not model expert-parallel decoders; simulate with ep_size 1");
  }
  Simulation sim(c, in, mc, cost);
  return sim.Run(calib, progress);
}

}  // namespace eldr
