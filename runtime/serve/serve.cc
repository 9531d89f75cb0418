#include "runtime/serve/serve.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <deque>
#include <map>
#include <optional>
#include <thread>

#include "runtime/calib/calibration.h"
#include "runtime/comm/kv_transport.h"
#include "runtime/common/atomic_file.h"
#include "runtime/common/json_util.h"
#include "runtime/common/progress.h"
#include "runtime/job/frontend.h"
#include "runtime/job/metrics.h"
#include "runtime/job/workload.h"
#include "runtime/kvcache/prefill_signature.h"
#include "runtime/model/executor.h"
#include "runtime/router/router.h"
#include "runtime/serve/decode_worker.h"
#include "runtime/serve/expert_parallel.h"
#include "runtime/serve/protocol.h"
#include "runtime/trace/trace.h"

namespace eldr {

namespace {

// Blocking receive that sleeps between polls: Open MPI's blocking receive spins a core, and on a node
// where ranks outnumber cores (this demo: 6 ranks, 2 cores) the spinning steals the workers' time.
Message WaitMessage(Transport& tr) {
  int idle = 0;
  while (!tr.Poll(Transport::kAnySource, Transport::kAnyTag)) {
    std::this_thread::sleep_for(std::chrono::microseconds(idle < 100 ? 20 : 200));
    ++idle;
  }
  return tr.Recv(Transport::kAnySource, Transport::kAnyTag);
}

template <typename Msg>
void SendMsg(Transport& tr, int dest, const Msg& m) {
  const std::vector<uint8_t> bytes = m.Encode();
  tr.Send(dest, Msg::kTag, bytes.data(), bytes.size());
}

// The message `msg` carries, checked against its MPI tag; errors name the sender.
template <typename Msg>
Result<Msg> DecodeMsg(const Message& msg) {
  Result<Msg> m = msg.tag == Msg::kTag
                      ? Msg::Decode(msg.payload)
                      : Result<Msg>(Status::Corrupt(std::string("protocol: expected a ") + MessageTagName(Msg::kTag) +
                                                    " message, got MPI tag " + std::to_string(msg.tag)));
  if (!m.ok()) return m.status().WithPrefix("from rank " + std::to_string(msg.source));
  return m;
}

// Fault injection for the watchdog test: ELDR_FAULT_HANG_RANK=r makes rank r stop answering after its first
// message, as a hung GPU or a deadlocked rank would.
bool ShouldHang(int rank) {
  const char* v = std::getenv("ELDR_FAULT_HANG_RANK");
  return v && std::atoi(v) == rank;
}

void HangForever() {
  while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
}

// ELDR_FAULT_DIE_RANK=r makes rank r exit abruptly after its first message, as a crashed process would.
void MaybeDie(int rank) {
  const char* v = std::getenv("ELDR_FAULT_DIE_RANK");
  if (v && std::atoi(v) == rank) std::_Exit(9);
}

// When another rank dies, mpirun/srun send SIGTERM to the survivors before killing them. Rank 0 turns it into
// a flag its loop checks, so it can still write the metrics it has. (A signal handler can only set a flag:
// this is the one piece of process-wide state, and only rank 0's loop reads it.)
volatile std::sig_atomic_t g_terminate_requested = 0;
extern "C" void OnTerminate(int) { g_terminate_requested = 1; }

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// CPU time of this process (all its threads), for the step log: on a machine where ranks share cores it is a
// step's work on a dedicated core, which wall time is not.
double CpuNow() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

Result<ModelWeights> LoadWeights(const JobConfig& c, const ModelConfig& mc, int num_domains) {
  if (c.weights == "synthetic") {
    SyntheticWeightOptions o;
    o.seed = c.weight_seed;
    o.num_domains = std::max(1, num_domains);
    return MakeSyntheticWeights(mc, o);
  }
  return LoadSafetensors(mc, c.weights);
}

Status CheckShapes(const JobConfig& c, const ModelConfig& mc, const Trace& t) {
  if (c.replay_gates && !mc.trace_shape().SameAs(t.shape)) {
    return Status::FailedPrecondition(c.trace + ": routing shape " + t.shape.ToString() + " differs from the model " +
                                      c.model_config + " (" + mc.trace_shape().ToString() +
                                      "); replay needs the same MoE layers, experts and top-k");
  }
  return Status::Ok();
}

// ---------------------------------------------------------------- prefill rank
// Prefills the requests rank 0 sends, returns their counts and first token, and ships each one's KV to the
// decoder rank 0 routes it to. `kv_data`: the KV data plane (NCCL), or null to ship the KV inside the KvMsg.
class PrefillRank {
 public:
  PrefillRank(const JobConfig& c, Transport& tr, const JobRequests& in, const ModelWeights& w, KvTransport* kv_data)
      : c_(c),
        tr_(tr),
        in_(in),
        kv_data_(kv_data),
        domains_(in.trace.Domains()),
        ex_(w, c.prefill_blocks, c.block_size),
        bm_(c.prefill_blocks, c.block_size),
        sig_(c.prefill_blocks, w.config.num_moe_layers(), w.config.num_experts, c.block_size) {
    AttachSignatureCache(bm_, sig_);
  }

  Status Run() {
    const bool hang = ShouldHang(tr_.rank());
    while (true) {
      // Routing decisions first: shipping a routed request's KV lets its decoder start and frees its blocks, so
      // a burst of new prompts must not hold the requests already prefilled and routed (DESIGN.md §2: the KV
      // moves as soon as the router has decided).
      Message msg = tr_.Poll(0, kTagRoute) ? tr_.Recv(0, kTagRoute) : WaitMessage(tr_);
      if (msg.tag == kTagShutdown) return Status::Ok();
      if (hang) HangForever();
      MaybeDie(tr_.rank());
      if (msg.tag == kTagPrefill) {
        ELDR_RETURN_IF_ERROR(OnPrefill(msg));
      } else if (msg.tag == kTagRoute) {
        ELDR_RETURN_IF_ERROR(OnRoute(msg));
      } else {
        return Status::Corrupt("prefill: unexpected " + std::string(MessageTagName(msg.tag)) + " message (tag " +
                               std::to_string(msg.tag) + ") from rank " + std::to_string(msg.source));
      }
    }
  }

 private:
  struct Pending {
    std::vector<BlockId> blocks;
    int32_t first_token;
  };

  Status OnPrefill(const Message& msg) {
    ELDR_ASSIGN_OR_RETURN(PrefillRequestMsg m, DecodeMsg<PrefillRequestMsg>(msg));
    if (m.request < 0 || m.request >= in_.size()) {
      return Status::Corrupt("prefill: request " + std::to_string(m.request) + " is not in the workload");
    }
    if (!waiting_blocks_.empty()) {
      waiting_blocks_.push_back(m.request);
      return Status::Ok();
    }
    ELDR_ASSIGN_OR_RETURN(bool done, TryPrefill(m.request));
    if (!done) waiting_blocks_.push_back(m.request);
    return Status::Ok();
  }

  // Prefills `req` and sends its counts: true when done (or failed for good), false when it must wait for
  // blocks.
  Result<bool> TryPrefill(int64_t req) {
    const TraceRequest& r = in_.request(req);
    const std::vector<int32_t> tokens = PromptTokens(r, domains_, ex_.config().vocab_size);
    auto alloc = bm_.AllocatePrompt(tokens);
    if (!alloc.ok()) {
      if (static_cast<int64_t>((tokens.size() + c_.block_size - 1) / c_.block_size) <= c_.prefill_blocks) return false;
      SendMsg(tr_, 0,
              FailedMsg{req, "prompt of " + std::to_string(tokens.size()) + " tokens exceeds the prefill KV cache"});
      return true;
    }
    const int cached = alloc->num_cached_tokens();
    // A full hit still recomputes the last token (its logits give the first output token).
    const int from = std::min(cached, static_cast<int>(tokens.size()) - 1);
    std::vector<uint16_t> replay_ids;
    GateReplay replay;
    if (c_.replay_gates) {
      replay_ids = RoutingRows(in_.trace, r, from, r.prompt_len - from);
      replay.ids = replay_ids.data();
    }
    const double start = Now(), cpu_start = CpuNow();
    auto pre =
        ex_.Prefill(tokens, alloc->blocks, from, c_.replay_gates ? &replay : nullptr, from == cached ? &sig_ : nullptr);
    if (!pre.ok()) return pre.status();
    CountsMsg m{req,           pre->next_token,      std::vector<float>(sig_.row_size()),
                Now() - start, CpuNow() - cpu_start, static_cast<int64_t>(tokens.size()) - from};
    sig_.SumCounts(alloc->blocks, nullptr, m.counts.data());
    SendMsg(tr_, 0, m);
    waiting_route_[req] = {alloc->blocks, pre->next_token};
    return true;
  }

  Status OnRoute(const Message& msg) {
    ELDR_ASSIGN_OR_RETURN(RouteMsg m, DecodeMsg<RouteMsg>(msg));
    auto it = waiting_route_.find(m.request);
    if (it == waiting_route_.end())
      return Status::FailedPrecondition("prefill: routing decision for an unknown request");
    ELDR_RETURN_IF_ERROR(ShipKv(m.request, m.decoder_rank, it->second));
    bm_.Free(it->second.blocks);
    waiting_route_.erase(it);
    while (!waiting_blocks_.empty()) {
      ELDR_ASSIGN_OR_RETURN(bool done, TryPrefill(waiting_blocks_.front()));
      if (!done) break;
      waiting_blocks_.pop_front();
    }
    return Status::Ok();
  }

  Status ShipKv(int64_t req, int decoder_rank, const Pending& p) {
    const TraceRequest& r = in_.request(req);
    KvMsg m;
    m.request = req;
    m.prompt_len = r.prompt_len;
    m.output_len = in_.output_len[req];
    m.first_token = p.first_token;
    std::vector<float> kv(static_cast<size_t>(r.prompt_len * ex_.KvFloatsPerToken()));
    ex_.ExportKv(p.blocks, static_cast<int>(r.prompt_len), kv.data());
    m.kv_inline = kv_data_ == nullptr;
    m.kv_floats = kv.size();
    m.kv_checksum = KvChecksum(kv);
    if (c_.replay_gates && m.output_len > 1) m.replay_ids = RoutingRows(in_.trace, r, r.prompt_len, m.output_len - 1);
    if (m.kv_inline) m.kv = std::move(kv);
    SendMsg(tr_, decoder_rank, m);
    // Right after its control message, in the same order: the decoder posts the matching receive when it
    // handles that message, so a pair's NCCL sends and receives always pair up in order.
    if (kv_data_) ELDR_RETURN_IF_ERROR(kv_data_->SendFromHost(decoder_rank, kv.data(), kv.size() * sizeof(float)));
    return Status::Ok();
  }

  const JobConfig& c_;
  Transport& tr_;
  const JobRequests& in_;
  KvTransport* kv_data_;
  const std::vector<std::string> domains_;
  Executor ex_;
  BlockManager bm_;
  SignatureCache sig_;
  std::map<int64_t, Pending> waiting_route_;
  std::deque<int64_t> waiting_blocks_;  // requests whose prompt does not fit until KV is shipped
};

// ---------------------------------------------------------------- decode rank
// Receives prefilled requests, batches them and reports every step's tokens to rank 0. With an EP group
// (ep_size > 1) this is the group's leader: its MoE layers go through EpExpertBackend, and it stops the members
// when rank 0 shuts it down. `kv_data`: the KV data plane (NCCL), or null when the KV comes inside the KvMsg.
class DecodeRank {
 public:
  DecodeRank(const JobConfig& c, Transport& tr, const ModelWeights& w, const Placement& placement, GroupComm* group,
             KvTransport* kv_data)
      : tr_(tr),
        kv_data_(kv_data),
        kv_floats_per_token_(2LL * w.config.num_hidden_layers * w.config.num_key_value_heads * w.config.head_dim),
        ep_(group ? std::make_unique<EpExpertBackend>(w, placement, *group) : nullptr),
        worker_(w, {c.decode_blocks, c.block_size, c.max_batch, ep_.get()}),
        hang_(ShouldHang(tr.rank())) {}

  Status Run() {
    bool stop = false;
    // A step's logged time is the decoder's whole busy iteration: receiving and importing KV, admission, the
    // step itself and sending the previous step's tokens — everything but waiting idle for work.
    ResetIteration();
    while (!stop) {
      while (!stop && tr_.Poll(Transport::kAnySource, Transport::kAnyTag)) {
        ELDR_RETURN_IF_ERROR(Handle(tr_.Recv(Transport::kAnySource, Transport::kAnyTag), &stop));
      }
      if (stop) break;
      if (worker_.in_flight() == 0) {
        Message msg = WaitMessage(tr_);
        ResetIteration();
        ELDR_RETURN_IF_ERROR(Handle(std::move(msg), &stop));
        continue;
      }
      ELDR_RETURN_IF_ERROR(StepAndReport());
    }
    if (ep_) ep_->StopMembers();
    return Status::Ok();
  }

 private:
  void ResetIteration() {
    iteration_start_ = Now();
    iteration_cpu_start_ = CpuNow();
  }

  Status Handle(Message msg, bool* stop) {
    if (msg.tag == kTagShutdown) {
      *stop = true;
      return Status::Ok();
    }
    if (hang_) HangForever();
    MaybeDie(tr_.rank());
    ELDR_ASSIGN_OR_RETURN(KvMsg m, DecodeMsg<KvMsg>(msg));
    DecodeWork d{m.request, m.prompt_len, m.output_len, m.first_token, std::move(m.kv), {}, std::move(m.replay_ids)};
    if (m.kv_inline == (kv_data_ != nullptr)) {
      return Status::Corrupt("decode: the KV of request " + std::to_string(m.request) +
                             (m.kv_inline ? " came inline, expected over the KV transport" : " is not inline"));
    }
    if (kv_data_) {
      // Posted before anything else is handled: the sender's transfer follows this message (PrefillRank::ShipKv).
      if (m.prompt_len < 0 || m.kv_floats != static_cast<uint64_t>(m.prompt_len * kv_floats_per_token_)) {
        return Status::Corrupt("decode: request " + std::to_string(m.request) + " announces " +
                               std::to_string(m.kv_floats) + " KV floats for a prompt of " +
                               std::to_string(m.prompt_len));
      }
      d.kv.resize(m.kv_floats);
      ELDR_RETURN_IF_ERROR(kv_data_->RecvToHost(msg.source, d.kv.data(), d.kv.size() * sizeof(float)));
    }
    Status st = KvChecksum(d.kv) == m.kv_checksum ? worker_.Submit(std::move(d))
                                                  : Status::Corrupt("KV blocks arrived corrupted (checksum mismatch)");
    if (!st.ok()) SendMsg(tr_, 0, FailedMsg{m.request, st.message()});
    return Status::Ok();
  }

  Status StepAndReport() {
    ELDR_ASSIGN_OR_RETURN(StepReport rep, worker_.Step());
    const double end = Now(), cpu_end = CpuNow();
    TokensMsg m;
    m.batch = rep.batch;
    m.distinct_experts = rep.distinct_experts;
    m.context_tokens = rep.context_tokens;
    m.seconds = end - iteration_start_;
    m.cpu_seconds = cpu_end - iteration_cpu_start_;
    iteration_start_ = end;
    iteration_cpu_start_ = cpu_end;
    m.tokens.reserve(rep.tokens.size());
    for (const TokenEvent& t : rep.tokens) m.tokens.push_back({t.id, t.index, t.token, t.finished});
    const EpStepLoad load = ep_ ? ep_->TakeStepLoad() : EpStepLoad();
    m.rank_load = load.rank_load;
    m.balancedness = load.balancedness();
    SendMsg(tr_, 0, m);
    return Status::Ok();
  }

  Transport& tr_;
  KvTransport* kv_data_;
  const int64_t kv_floats_per_token_;  // Executor::KvFloatsPerToken
  std::unique_ptr<EpExpertBackend> ep_;
  DecodeWorker worker_;
  const bool hang_;
  double iteration_start_ = 0, iteration_cpu_start_ = 0;
};

// ---------------------------------------------------------------- rank 0: frontend + router
// The Frontend (job/frontend.h) decides; this class moves its decisions and the workers' reports over MPI,
// stamps arrival times, keeps the step log and runs the ready barrier and the watchdog.
class RouterRank {
 public:
  RouterRank(const JobConfig& c, Transport& tr, const JobRequests& in, const ModelConfig& mc, const char* kv_transport)
      : c_(c), tr_(tr), in_(in), mc_(mc), kv_transport_(kv_transport), last_heard_(tr.size(), 0) {}

  Status Run(bool progress) {
    ELDR_RETURN_IF_ERROR(CreateFrontend());
    ELDR_RETURN_IF_ERROR(WaitReady());
    ProgressBar bar("serving " + std::string(RoutingPolicyName(c_.policy)), in_.size(), progress);
    start_ = Now();
    std::fill(last_heard_.begin(), last_heard_.end(), start_);
    const Status served = Serve(bar);
    bar.Finish();
    if (!served.ok()) {
      ShutdownWorkers();
      return served;
    }
    const std::string watchdog = frontend_->done() ? "" : WatchdogReport();
    const Status written = WriteOutputs(watchdog);
    ShutdownWorkers();
    ELDR_RETURN_IF_ERROR(written);
    if (!watchdog.empty()) return Status::FailedPrecondition(watchdog + " metrics written to " + c_.output_dir);
    return Status::Ok();
  }

 private:
  Status CreateFrontend() {
    std::unique_ptr<Calibration> calib;
    if (!c_.calibration.empty()) {
      ELDR_ASSIGN_OR_RETURN(Calibration cal, ReadCalibration(c_.calibration));
      calib = std::make_unique<Calibration>(std::move(cal));
    }
    FrontendActions actions;
    actions.send_to_prefill = [this](int64_t req, int p) { SendMsg(tr_, 1 + p, PrefillRequestMsg{req}); };
    actions.send_route = [this](int64_t req, int d) {
      SendMsg(tr_, 1 + frontend_->prefill_of(req), RouteMsg{req, c_.DecoderLeaderRank(d)});
    };
    ELDR_ASSIGN_OR_RETURN(Frontend f, Frontend::Create(c_, in_, mc_.trace_shape(), calib.get(), std::move(actions)));
    frontend_.emplace(std::move(f));
    return Status::Ok();
  }

  // Loading weights is not serving time: the arrival clock starts when every other rank has reported ready.
  Status WaitReady() {
    std::vector<bool> ready(tr_.size(), false);
    int num_ready = 0;
    const double wait_start = Now();
    while (num_ready < tr_.size() - 1) {
      if (tr_.Poll(Transport::kAnySource, kTagReady)) {
        const Message m = tr_.Recv(Transport::kAnySource, kTagReady);
        ELDR_RETURN_IF_ERROR(DecodeMsg<ReadyMsg>(m).status());
        if (!ready[m.source]) ++num_ready;
        ready[m.source] = true;
        continue;
      }
      if (g_terminate_requested || Now() - wait_start > c_.watchdog_s) {
        std::string missing;
        for (int r = 1; r < tr_.size(); ++r) {
          if (!ready[r]) missing += (missing.empty() ? "" : ", ") + c_.RoleOf(r) + " (rank " + std::to_string(r) + ")";
        }
        for (int r = 1; r < tr_.size(); ++r) SendMsg(tr_, r, ShutdownMsg{});
        return Status::FailedPrecondition("not ready after " + Fmt(Now() - wait_start, 0) +
                                          " s (loading weights; raise watchdog_s for a large model): " + missing);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return Status::Ok();
  }

  // Until every request is accounted for, or the watchdog (no message for watchdog_s, or the launcher ending
  // the job) stops it with work outstanding. Errors: a malformed message.
  Status Serve(ProgressBar& bar) {
    double last_progress = Now();
    while (!frontend_->done()) {
      // Send what has arrived (within max_concurrency) to the prefill rank with the least outstanding work.
      const double now = Now() - start_;
      frontend_->Admit(frontend_->DueBy(now), now);
      if (!tr_.Poll(Transport::kAnySource, Transport::kAnyTag)) {
        if (Now() - last_progress > c_.watchdog_s || g_terminate_requested) return Status::Ok();
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        continue;
      }
      const Message msg = tr_.Recv(Transport::kAnySource, Transport::kAnyTag);
      last_progress = Now();
      last_heard_[msg.source] = last_progress;
      ELDR_RETURN_IF_ERROR(Handle(msg, last_progress - start_));
      bar.Update(frontend_->num_done());
    }
    return Status::Ok();
  }

  Status Handle(const Message& msg, double t) {
    switch (msg.tag) {
      case kTagCounts:
        return OnCounts(msg, t);
      case kTagTokens:
        return OnTokens(msg, t);
      case kTagFailed:
        return OnFailed(msg);
      default:
        return Status::Corrupt("router: unexpected " + std::string(MessageTagName(msg.tag)) + " message (tag " +
                               std::to_string(msg.tag) + ") from rank " + std::to_string(msg.source));
    }
  }

  // A request id from `source` must be one rank 0 has sent.
  Status CheckRequest(int64_t req, int source) const {
    if (req >= 0 && req < frontend_->sent()) return Status::Ok();
    return Status::Corrupt("router: rank " + std::to_string(source) + " reports request " + std::to_string(req) +
                           ", which was never sent");
  }

  Status OnCounts(const Message& msg, double t) {
    ELDR_ASSIGN_OR_RETURN(CountsMsg m, DecodeMsg<CountsMsg>(msg));
    ELDR_RETURN_IF_ERROR(CheckRequest(m.request, msg.source));
    if (m.counts.size() != static_cast<size_t>(mc_.num_moe_layers()) * mc_.num_experts) {
      return Status::Corrupt("router: counts of request " + std::to_string(m.request) + " have " +
                             std::to_string(m.counts.size()) + " entries, expected L x E");
    }
    step_log_.push_back(
        {"prefill", frontend_->prefill_of(m.request), t, m.seconds, 1, 0, m.computed_tokens, m.cpu_seconds});
    frontend_->OnFirstToken(m.request, t, m.first_token, std::move(m.counts));
    return Status::Ok();
  }

  Status OnTokens(const Message& msg, double t) {
    ELDR_ASSIGN_OR_RETURN(TokensMsg m, DecodeMsg<TokensMsg>(msg));
    const int decoder = c_.DecoderOfRank(msg.source);
    if (decoder < 0)
      return Status::Corrupt("router: tokens from rank " + std::to_string(msg.source) + ", not a decoder");
    for (const TokenRecord& tok : m.tokens) ELDR_RETURN_IF_ERROR(CheckRequest(tok.request, msg.source));
    if (m.batch > 0) {
      step_log_.push_back(
          {"decode", decoder, t, m.seconds, m.batch, m.distinct_experts, m.context_tokens, m.cpu_seconds});
    }
    frontend_->OnDecodeStep(decoder, m.batch, m.distinct_experts, m.rank_load, m.balancedness);
    for (const TokenRecord& tok : m.tokens) {
      // Tokens of one request arrive in order from its decoder: the index needs no check.
      frontend_->OnToken(tok.request, t, tok.token);
      if (tok.finished) frontend_->Finish(tok.request, true);
    }
    return Status::Ok();
  }

  Status OnFailed(const Message& msg) {
    ELDR_ASSIGN_OR_RETURN(FailedMsg m, DecodeMsg<FailedMsg>(msg));
    ELDR_RETURN_IF_ERROR(CheckRequest(m.request, msg.source));
    frontend_->Finish(m.request, false,
                      c_.RoleOf(msg.source) + " (rank " + std::to_string(msg.source) + "): " + m.reason);
    return Status::Ok();
  }

  // Names the ranks that hold work, the longest silent first (a hung rank has been silent since it hung, while
  // a rank blocked sending to it went silent later), and marks the unfinished requests failed.
  std::string WatchdogReport() {
    std::string report = g_terminate_requested ? std::string("job terminated by the launcher (a rank exited);")
                                               : "watchdog: no progress for " + Fmt(c_.watchdog_s, 0) + " s;";
    std::vector<std::pair<int, int64_t>> holders;  // (rank, requests)
    for (int p = 0; p < c_.prefill_ranks; ++p) {
      if (frontend_->prefill_outstanding(p) > 0) holders.emplace_back(1 + p, frontend_->prefill_outstanding(p));
    }
    for (int d = 0; d < c_.decode_ranks; ++d) {
      if (frontend_->decoder_in_flight(d) > 0)
        holders.emplace_back(c_.DecoderLeaderRank(d), frontend_->decoder_in_flight(d));
    }
    std::stable_sort(holders.begin(), holders.end(),
                     [&](const auto& a, const auto& b) { return last_heard_[a.first] < last_heard_[b.first]; });
    const double now = Now();
    for (const auto& [rank, requests] : holders) {
      report += " " + c_.RoleOf(rank) + " (rank " + std::to_string(rank) + ") holds " + std::to_string(requests) +
                " requests, silent " + Fmt(now - last_heard_[rank], 1) + " s;";
    }
    frontend_->AbandonUnfinished("never sent (job ended by the watchdog)", "unfinished (job ended by the watchdog)");
    return report;
  }

  // Metrics JSON (vLLM keys + eldr's), per-request JSONL, the step log and the summary.
  Status WriteOutputs(const std::string& watchdog) {
    nlohmann::json j =
        JobMetrics(c_, mc_.name, frontend_->records(), frontend_->DecoderStatistics(), frontend_->routing());
    j["kv_transport"] = kv_transport_;
    if (!watchdog.empty()) j["watchdog"] = watchdog;
    ELDR_RETURN_IF_ERROR(WriteJobOutputs(c_.output_dir, j, frontend_->records(), c_.output_tokens));
    ELDR_RETURN_IF_ERROR(WriteStepLog(c_.output_dir + "/steps.jsonl", step_log_));
    std::printf("%s", FormatServingSummary(j).c_str());
    std::fflush(stdout);
    return Status::Ok();
  }

  // Prefill ranks and decoder leaders; a leader stops its EP members.
  void ShutdownWorkers() {
    for (int r = 1; r <= c_.prefill_ranks; ++r) SendMsg(tr_, r, ShutdownMsg{});
    for (int d = 0; d < c_.decode_ranks; ++d) SendMsg(tr_, c_.DecoderLeaderRank(d), ShutdownMsg{});
  }

  const JobConfig& c_;
  Transport& tr_;
  const JobRequests& in_;
  const ModelConfig& mc_;
  const char* kv_transport_;
  std::optional<Frontend> frontend_;
  std::vector<StepRecord> step_log_;  // every prefill and decode step, for `eldr simulate --fit`
  std::vector<double> last_heard_;    // [world] when each rank was last heard from
  double start_ = 0;
};

}  // namespace

Status RunServeJob(const JobConfig& c, Transport& tr, bool progress) {
  ELDR_RETURN_IF_ERROR(CheckWorldSize(c, tr.size()));
  // The KV data plane, made once at start on every rank (collective for auto and nccl, so before any rank
  // takes its own path). Every rank gets the same kind or the same error, printed once.
  auto* mpi_tr = dynamic_cast<MpiTransport*>(&tr);
  if (!mpi_tr && c.kv_transport == "nccl") {
    return Status::InvalidArgument(c.path + ": kv_cache.transport nccl needs the MPI control plane, not " + tr.name());
  }
  std::unique_ptr<KvTransport> kv;
  if (mpi_tr) {
    auto kv_or = MakeJobKvTransport(c.kv_transport, mpi_tr->comm());
    if (!kv_or.ok()) {
      const Status& st = kv_or.status();
      return Status(st.code() == StatusCode::kFailedPrecondition ? StatusCode::kInvalidArgument : st.code(),
                    c.path + ": kv_cache.transport: " + st.message());
    }
    kv = std::move(kv_or).value();
  }
  // MPI carries the KV inside the control message itself (one message, as before KvTransport existed).
  KvTransport* kv_data = kv && std::string(kv->name()) == "nccl" ? kv.get() : nullptr;
  const char* kv_name = kv_data ? "nccl" : "mpi";
  ELDR_ASSIGN_OR_RETURN(ModelConfig mc, LoadModelConfig(c.model_config));
  ELDR_ASSIGN_OR_RETURN(JobRequests in, LoadJobRequests(c));
  ELDR_RETURN_IF_ERROR(CheckShapes(c, mc, in.trace));
  const int rank = tr.rank();
  // Every rank checks every decoder's placement, so a bad one fails the job before it starts, printed once.
  std::vector<Placement> placements;
  for (int d = 0; d < c.decode_ranks; ++d) {
    ELDR_ASSIGN_OR_RETURN(Placement p, LoadDecoderPlacement(c, mc, d));
    placements.push_back(std::move(p));
  }
  // One communicator per EP group; MPI_Comm_split is collective over the whole job, so every rank calls it.
  GroupComm group;
  if (c.ep_size > 1) {
    auto* mpi = dynamic_cast<MpiTransport*>(&tr);
    if (!mpi)
      return Status::FailedPrecondition(std::string("decode.ep_size > 1 needs the MPI transport, not ") + tr.name());
    group = GroupComm::Split(mpi->comm(), c.DecoderOfRank(rank), rank);
  }
  if (rank == 0) {
    std::signal(SIGTERM, OnTerminate);
    return RouterRank(c, tr, in, mc, kv_name).Run(progress);
  }
  ELDR_ASSIGN_OR_RETURN(ModelWeights w, LoadWeights(c, mc, static_cast<int>(in.trace.Domains().size())));
  SendMsg(tr, 0, ReadyMsg{});
  if (rank <= c.prefill_ranks) return PrefillRank(c, tr, in, w, kv_data).Run();
  const Placement& placement = placements[c.DecoderOfRank(rank)];
  if (!group.valid()) return DecodeRank(c, tr, w, placement, nullptr, kv_data).Run();
  return group.rank() == 0 ? DecodeRank(c, tr, w, placement, &group, kv_data).Run() : RunEpMember(w, placement, group);
}

}  // namespace eldr
