#include "runtime/serve/serve.h"

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <deque>
#include <functional>
#include <map>
#include <random>
#include <thread>

#include "runtime/calib/calibration.h"
#include "runtime/comm/kv_transport.h"
#include "runtime/common/atomic_file.h"
#include "runtime/common/json_util.h"
#include "runtime/common/progress.h"
#include "runtime/kvcache/prefill_signature.h"
#include "runtime/model/executor.h"
#include "runtime/router/router.h"
#include "runtime/serve/decode_worker.h"
#include "runtime/serve/expert_parallel.h"
#include "runtime/serve/metrics.h"
#include "runtime/serve/workload.h"
#include "runtime/trace/trace.h"

namespace eldr {

namespace {

enum Tag : int {
  kTagPrefill = 1,   // 0 → prefill: {request}
  kTagCounts = 2,    // prefill → 0: {request, first token, counts [L, E]}
  kTagRoute = 3,     // 0 → prefill: {request, decoder rank}
  kTagKv = 4,        // prefill → decode: the DecodeWork (its KV floats inline, or over the KV transport)
  kTagTokens = 5,    // decode → 0: {step stats, token events, EP rank loads [G] and balancedness}
  kTagFailed = 6,    // prefill/decode → 0: {request, reason}
  kTagShutdown = 7,  // 0 → all
  kTagReady = 8,     // every other rank → 0, once its weights are loaded: the clock starts when all are
};

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

// FNV-1a over the KV payload's bytes: the decoder checks that the blocks arrived intact.
uint64_t Checksum(const std::vector<float>& v) {
  uint64_t h = 1469598103934665603ULL;
  const auto* p = reinterpret_cast<const uint8_t*>(v.data());
  for (size_t i = 0; i < v.size() * sizeof(float); ++i) h = (h ^ p[i]) * 1099511628211ULL;
  return h;
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

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

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
// `kv_data`: the KV data plane (NCCL), or null to ship the KV inside the kTagKv message (MPI).
Status RunPrefill(const JobConfig& c, Transport& tr, const JobRequests& in, const ModelWeights& w, KvTransport* kv_data) {
  const ModelConfig& mc = w.config;
  const std::vector<std::string> domains = in.trace.Domains();
  Executor ex(w, c.prefill_blocks, c.block_size);
  BlockManager bm(c.prefill_blocks, c.block_size);
  SignatureCache sig(c.prefill_blocks, mc.num_moe_layers(), mc.num_experts, c.block_size);
  AttachSignatureCache(bm, sig);
  struct Pending {
    std::vector<BlockId> blocks;
    int32_t first_token;
  };
  std::map<int64_t, Pending> waiting_route;
  std::deque<int64_t> waiting_blocks;  // requests whose prompt does not fit until KV is shipped
  auto try_prefill = [&](int64_t req) -> Result<bool> {
    const TraceRequest& r = in.trace.requests[in.order[req]];
    const std::vector<int32_t> tokens = PromptTokens(r, domains, mc.vocab_size);
    auto alloc = bm.AllocatePrompt(tokens);
    if (!alloc.ok()) {
      if (static_cast<int64_t>((tokens.size() + c.block_size - 1) / c.block_size) > c.prefill_blocks) {
        Wire f;
        f.Put<int64_t>(req).PutString("prompt of " + std::to_string(tokens.size()) + " tokens exceeds the prefill KV cache");
        tr.Send(0, kTagFailed, f.bytes().data(), f.bytes().size());
        return true;
      }
      return false;  // wait for blocks
    }
    const int cached = alloc->num_cached_tokens();
    // A full hit still recomputes the last token (its logits give the first output token).
    const int from = std::min(cached, static_cast<int>(tokens.size()) - 1);
    std::vector<uint16_t> replay_ids;
    GateReplay replay;
    if (c.replay_gates) {
      replay_ids = RoutingRows(in.trace, r, from, r.prompt_len - from);
      replay.ids = replay_ids.data();
    }
    const double prefill_start = Now(), prefill_cpu_start = CpuNow();
    auto pre = ex.Prefill(tokens, alloc->blocks, from, c.replay_gates ? &replay : nullptr, from == cached ? &sig : nullptr);
    if (!pre.ok()) return pre.status();
    const double prefill_seconds = Now() - prefill_start, prefill_cpu = CpuNow() - prefill_cpu_start;
    std::vector<float> counts(sig.row_size());
    sig.SumCounts(alloc->blocks, nullptr, counts.data());
    Wire m;
    m.Put<int64_t>(req).Put<int32_t>(pre->next_token).PutVector(counts);
    m.Put<double>(prefill_seconds).Put<double>(prefill_cpu).Put<int64_t>(static_cast<int64_t>(tokens.size()) - from);
    tr.Send(0, kTagCounts, m.bytes().data(), m.bytes().size());
    waiting_route[req] = {alloc->blocks, pre->next_token};
    return true;
  };
  const bool hang = ShouldHang(tr.rank());
  while (true) {
    // Routing decisions first: shipping a routed request's KV lets its decoder start and frees its blocks, so a
    // burst of new prompts must not hold the requests already prefilled and routed (DESIGN.md §2: the KV moves
    // as soon as the router has decided).
    Message msg = tr.Poll(0, kTagRoute) ? tr.Recv(0, kTagRoute) : WaitMessage(tr);
    if (msg.tag == kTagShutdown) return Status::Ok();
    if (hang) HangForever();
    MaybeDie(tr.rank());
    Wire in_msg(std::move(msg.payload));
    if (msg.tag == kTagPrefill) {
      const int64_t req = in_msg.Get<int64_t>();
      if (!waiting_blocks.empty()) {
        waiting_blocks.push_back(req);
        continue;
      }
      ELDR_ASSIGN_OR_RETURN(bool done, try_prefill(req));
      if (!done) waiting_blocks.push_back(req);
    } else if (msg.tag == kTagRoute) {
      const int64_t req = in_msg.Get<int64_t>();
      const int32_t decoder_rank = in_msg.Get<int32_t>();
      auto it = waiting_route.find(req);
      if (it == waiting_route.end()) return Status::FailedPrecondition("prefill: routing decision for an unknown request");
      const TraceRequest& r = in.trace.requests[in.order[req]];
      DecodeWork d;
      d.id = std::to_string(req);
      d.prompt_len = r.prompt_len;
      d.output_len = in.output_len[req];
      d.first_token = it->second.first_token;
      d.kv.resize(static_cast<size_t>(r.prompt_len * ex.KvFloatsPerToken()));
      ex.ExportKv(it->second.blocks, static_cast<int>(r.prompt_len), d.kv.data());
      Wire kv;
      kv.Put<int64_t>(req).Put<int64_t>(d.prompt_len).Put<int64_t>(d.output_len).Put<int32_t>(d.first_token);
      if (kv_data) {
        kv.Put<uint64_t>(d.kv.size());  // the floats follow over the KV transport
      } else {
        kv.PutVector(d.kv);
      }
      kv.Put<uint64_t>(Checksum(d.kv));
      kv.PutVector(c.replay_gates && d.output_len > 1 ? RoutingRows(in.trace, r, r.prompt_len, d.output_len - 1)
                                                      : std::vector<uint16_t>{});
      tr.Send(decoder_rank, kTagKv, kv.bytes().data(), kv.bytes().size());
      // Right after its control message, in the same order: the decoder posts the matching receive when it
      // handles that message, so a pair's NCCL sends and receives always pair up in order.
      if (kv_data) ELDR_RETURN_IF_ERROR(kv_data->SendFromHost(decoder_rank, d.kv.data(), d.kv.size() * sizeof(float)));
      bm.Free(it->second.blocks);
      waiting_route.erase(it);
      while (!waiting_blocks.empty()) {
        ELDR_ASSIGN_OR_RETURN(bool done, try_prefill(waiting_blocks.front()));
        if (!done) break;
        waiting_blocks.pop_front();
      }
    }
  }
}

// ---------------------------------------------------------------- decode rank
// With an EP group (ep_size > 1) this is the group's leader: its MoE layers go through EpExpertBackend, and it
// stops the members when rank 0 shuts it down.
// `kv_data`: the KV data plane (NCCL), or null when the KV comes inside the kTagKv message (MPI).
Status RunDecode(const JobConfig& c, Transport& tr, const ModelWeights& w, const Placement& placement,
                 GroupComm* group, KvTransport* kv_data) {
  std::unique_ptr<EpExpertBackend> ep;
  if (group) ep = std::make_unique<EpExpertBackend>(w, placement, *group);
  DecodeWorker worker(w, {c.decode_blocks, c.block_size, c.max_batch, ep.get()});
  const bool hang = ShouldHang(tr.rank());
  auto handle = [&](Message msg, bool* stop) -> Status {
    if (msg.tag == kTagShutdown) {
      *stop = true;
      return Status::Ok();
    }
    if (hang) HangForever();
    MaybeDie(tr.rank());
    if (msg.tag != kTagKv) return Status::FailedPrecondition("decode: unexpected message tag " + std::to_string(msg.tag));
    Wire m(std::move(msg.payload));
    DecodeWork d;
    const int64_t req = m.Get<int64_t>();
    d.id = std::to_string(req);
    d.prompt_len = m.Get<int64_t>();
    d.output_len = m.Get<int64_t>();
    d.first_token = m.Get<int32_t>();
    if (kv_data) {
      // Posted before anything else is handled: the sender's transfer follows this message (see RunPrefill).
      d.kv.resize(m.Get<uint64_t>());
      ELDR_RETURN_IF_ERROR(kv_data->RecvToHost(msg.source, d.kv.data(), d.kv.size() * sizeof(float)));
    } else {
      d.kv = m.GetVector<float>();
    }
    const uint64_t checksum = m.Get<uint64_t>();
    d.replay_ids = m.GetVector<uint16_t>();
    Status st = Checksum(d.kv) == checksum
                    ? worker.Submit(std::move(d))
                    : Status::Corrupt("KV blocks arrived corrupted (checksum mismatch)");
    if (!st.ok()) {
      Wire f;
      f.Put<int64_t>(req).PutString(st.message());
      tr.Send(0, kTagFailed, f.bytes().data(), f.bytes().size());
    }
    return Status::Ok();
  };
  bool stop = false;
  // A step's logged time is the decoder's whole busy iteration: receiving and importing KV, admission, the
  // step itself and sending the previous step's tokens — everything but waiting idle for work.
  double iteration_start = Now(), iteration_cpu_start = CpuNow();
  while (!stop) {
    while (!stop && tr.Poll(Transport::kAnySource, Transport::kAnyTag)) {
      ELDR_RETURN_IF_ERROR(handle(tr.Recv(Transport::kAnySource, Transport::kAnyTag), &stop));
    }
    if (stop) break;
    if (worker.in_flight() == 0) {
      Message msg = WaitMessage(tr);
      iteration_start = Now();
      iteration_cpu_start = CpuNow();
      ELDR_RETURN_IF_ERROR(handle(std::move(msg), &stop));
      continue;
    }
    ELDR_ASSIGN_OR_RETURN(StepReport rep, worker.Step());
    const double step_end = Now(), step_cpu_end = CpuNow();
    const double step_seconds = step_end - iteration_start, step_cpu = step_cpu_end - iteration_cpu_start;
    iteration_start = step_end;
    iteration_cpu_start = step_cpu_end;
    Wire m;
    m.Put<int32_t>(rep.batch).Put<int64_t>(rep.distinct_experts).Put<int64_t>(rep.context_tokens);
    m.Put<double>(step_seconds).Put<double>(step_cpu).Put<uint64_t>(rep.tokens.size());
    for (const auto& t : rep.tokens) {
      m.Put<int64_t>(std::stoll(t.id)).Put<int64_t>(t.index).Put<int32_t>(t.token).Put<uint8_t>(t.finished ? 1 : 0);
    }
    const EpStepLoad load = ep ? ep->TakeStepLoad() : EpStepLoad();
    m.PutVector(load.rank_load).Put<double>(load.balancedness());
    tr.Send(0, kTagTokens, m.bytes().data(), m.bytes().size());
  }
  if (ep) ep->StopMembers();
  return Status::Ok();
}

// ---------------------------------------------------------------- rank 0: frontend + router
Status RunRouter(const JobConfig& c, Transport& tr, const JobRequests& in, const ModelConfig& mc, bool progress,
                 const char* kv_transport) {
  const int64_t N = static_cast<int64_t>(in.order.size());
  std::unique_ptr<Calibration> calib;
  if (!c.calibration.empty()) {
    ELDR_ASSIGN_OR_RETURN(Calibration cal, ReadCalibration(c.calibration));
    calib = std::make_unique<Calibration>(std::move(cal));
  }
  const RouterConfig rc = JobRouterConfig(c, mc.trace_shape(), in.trace);
  auto router_or = Router::Create(rc, calib.get());
  if (!router_or.ok()) return router_or.status().WithPrefix(c.calibration.empty() ? c.path : c.calibration);
  Router router = std::move(router_or).value();
  ELDR_ASSIGN_OR_RETURN(std::vector<double> arrivals,
                        ArrivalTimes({N, c.request_rate, c.burstiness, c.workload_seed}));

  std::vector<RequestRecord> records(N);
  for (int64_t i = 0; i < N; ++i) {
    const TraceRequest& r = in.trace.requests[in.order[i]];
    records[i].id = in.ReportId(i);
    records[i].domain = r.domain;
    records[i].prompt_len = r.prompt_len;
  }
  std::vector<int64_t> prefill_outstanding(c.prefill_ranks, 0);
  std::vector<int> prefill_of(N, -1);
  std::vector<int64_t> decoder_requests(c.decode_ranks, 0), decoder_steps(c.decode_ranks, 0);
  std::vector<double> decoder_distinct(c.decode_ranks, 0), decoder_batch(c.decode_ranks, 0);
  // EP groups: Σ over steps of each EP rank's load, and every step's balancedness, per decoder.
  std::vector<std::vector<double>> decoder_rank_load(c.decode_ranks, std::vector<double>(c.ep_size, 0.0));
  std::vector<std::vector<double>> decoder_balancedness(c.decode_ranks);
  std::deque<std::pair<int64_t, std::vector<float>>> held;  // routed later: every decoder at its cap
  std::vector<StepRecord> step_log;  // every prefill and decode step, for `eldr simulate --fit`
  std::vector<double> last_heard(tr.size(), 0);
  int64_t next = 0, active = 0, done = 0, band_sum = 0, band_n = 0, fallbacks = 0;
  // Loading weights is not serving time: the arrival clock starts when every other rank has reported ready.
  {
    std::vector<bool> ready(tr.size(), false);
    int num_ready = 0;
    const double wait_start = Now();
    while (num_ready < tr.size() - 1) {
      if (tr.Poll(Transport::kAnySource, kTagReady)) {
        const Message m = tr.Recv(Transport::kAnySource, kTagReady);
        if (!ready[m.source]) ++num_ready;
        ready[m.source] = true;
        continue;
      }
      if (g_terminate_requested || Now() - wait_start > c.watchdog_s) {
        std::string missing;
        for (int r = 1; r < tr.size(); ++r) {
          if (!ready[r]) missing += (missing.empty() ? "" : ", ") + c.RoleOf(r) + " (rank " + std::to_string(r) + ")";
        }
        for (int r = 1; r < tr.size(); ++r) tr.Send(r, kTagShutdown, nullptr, 0);
        return Status::FailedPrecondition("not ready after " + Fmt(Now() - wait_start, 0) +
                                          " s (loading weights; raise watchdog_s for a large model): " + missing);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  ProgressBar bar("serving " + std::string(RoutingPolicyName(c.policy)), N, progress);
  const double start = Now();
  double last_progress = start;
  std::fill(last_heard.begin(), last_heard.end(), start);

  auto route = [&](int64_t req, const std::vector<float>& counts) -> bool {
    const RoutingDecision d = router.Route(counts.data(), nullptr, records[req].domain);
    if (d.decoder < 0) return false;
    router.Dispatch(d.decoder);
    if (UsesSignature(c.policy)) {
      band_sum += d.band_size;
      ++band_n;
    }
    fallbacks += d.fallback ? 1 : 0;
    records[req].decoder = d.decoder;
    ++decoder_requests[d.decoder];
    Wire m;
    m.Put<int64_t>(req).Put<int32_t>(c.DecoderLeaderRank(d.decoder));
    tr.Send(1 + prefill_of[req], kTagRoute, m.bytes().data(), m.bytes().size());
    return true;
  };
  auto finish = [&](int64_t req, bool ok, const std::string& err) {
    records[req].success = ok;
    records[req].error = err;
    records[req].output_len = static_cast<int64_t>(records[req].token_times.size());
    if (records[req].decoder >= 0) router.Complete(records[req].decoder);  // failed at the decoder: its slot frees too
    --active;
    ++done;
    bar.Update(done);
  };

  while (done < N) {
    const double now = Now();
    // Send what has arrived (within max_concurrency) to the prefill rank with the least outstanding work.
    while (next < N && arrivals[next] <= now - start && (c.max_concurrency == 0 || active < c.max_concurrency)) {
      const int p = static_cast<int>(std::min_element(prefill_outstanding.begin(), prefill_outstanding.end()) -
                                     prefill_outstanding.begin());
      records[next].arrival = now - start;
      prefill_of[next] = p;
      ++prefill_outstanding[p];
      Wire m;
      m.Put<int64_t>(next);
      tr.Send(1 + p, kTagPrefill, m.bytes().data(), m.bytes().size());
      ++next;
      ++active;
    }
    if (!tr.Poll(Transport::kAnySource, Transport::kAnyTag)) {
      if (Now() - last_progress > c.watchdog_s || g_terminate_requested) break;  // handled below
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      continue;
    }
    Message msg = tr.Recv(Transport::kAnySource, Transport::kAnyTag);
    const double t = Now() - start;
    last_progress = Now();
    last_heard[msg.source] = last_progress;
    Wire m(std::move(msg.payload));
    if (msg.tag == kTagCounts) {
      const int64_t req = m.Get<int64_t>();
      records[req].tokens.push_back(m.Get<int32_t>());
      std::vector<float> counts = m.GetVector<float>();
      const double seconds = m.Get<double>();
      const double cpu = m.Get<double>();
      const int64_t computed = m.Get<int64_t>();
      step_log.push_back({"prefill", prefill_of[req], t, seconds, 1, 0, computed, cpu});
      records[req].token_times.push_back(t);
      --prefill_outstanding[prefill_of[req]];
      if (!held.empty() || !route(req, counts)) held.emplace_back(req, std::move(counts));
    } else if (msg.tag == kTagTokens) {
      const int decoder = c.DecoderOfRank(msg.source);
      const int32_t batch = m.Get<int32_t>();
      const int64_t distinct = m.Get<int64_t>();
      const int64_t context = m.Get<int64_t>();
      const double seconds = m.Get<double>();
      const double cpu = m.Get<double>();
      const uint64_t n = m.Get<uint64_t>();
      if (batch > 0) step_log.push_back({"decode", decoder, t, seconds, batch, distinct, context, cpu});
      if (batch > 0) {
        ++decoder_steps[decoder];
        decoder_distinct[decoder] += static_cast<double>(distinct);
        decoder_batch[decoder] += batch;
      }
      for (uint64_t i = 0; i < n; ++i) {
        const int64_t req = m.Get<int64_t>();
        m.Get<int64_t>();  // token index (tokens of one request arrive in order from its decoder)
        const int32_t token = m.Get<int32_t>();
        const bool finished = m.Get<uint8_t>() != 0;
        if (records[req].token_times.size() < static_cast<size_t>(in.output_len[req])) {
          records[req].token_times.push_back(t);
          records[req].tokens.push_back(token);
        }
        if (finished) finish(req, true, "");
      }
      const std::vector<int64_t> rank_load = m.GetVector<int64_t>();  // empty unless ep_size > 1
      const double balancedness = m.Get<double>();
      if (batch > 0 && !rank_load.empty()) {
        for (size_t r = 0; r < rank_load.size() && r < decoder_rank_load[decoder].size(); ++r) {
          decoder_rank_load[decoder][r] += static_cast<double>(rank_load[r]);
        }
        decoder_balancedness[decoder].push_back(balancedness);
      }
      while (!held.empty() && route(held.front().first, held.front().second)) held.pop_front();
    } else if (msg.tag == kTagFailed) {
      const int64_t req = m.Get<int64_t>();
      const std::string why = c.RoleOf(msg.source) + " (rank " + std::to_string(msg.source) + "): " + m.GetString();
      if (prefill_of[req] >= 0 && records[req].token_times.empty()) --prefill_outstanding[prefill_of[req]];
      finish(req, false, why);
    }
  }
  bar.Finish();
  std::string watchdog;
  if (done < N) {
    // No message for watchdog_s with work outstanding, or the launcher is ending the job because a rank died:
    // name the ranks that hold work.
    watchdog = g_terminate_requested ? std::string("job terminated by the launcher (a rank exited);")
                                     : "watchdog: no progress for " + Fmt(c.watchdog_s, 0) + " s;";
    // The ranks holding work, the longest silent first: a hung rank has been silent since it hung, while a
    // rank blocked sending to it went silent later.
    struct Holder {
      int rank;
      int64_t requests;
    };
    std::vector<Holder> holders;
    for (int p = 0; p < c.prefill_ranks; ++p) {
      if (prefill_outstanding[p] > 0) holders.push_back({1 + p, prefill_outstanding[p]});
    }
    for (int d = 0; d < c.decode_ranks; ++d) {
      if (router.decoders()[d].in_flight > 0) holders.push_back({c.DecoderLeaderRank(d), router.decoders()[d].in_flight});
    }
    std::stable_sort(holders.begin(), holders.end(),
                     [&](const Holder& a, const Holder& b) { return last_heard[a.rank] < last_heard[b.rank]; });
    const double now = Now();
    for (const Holder& h : holders) {
      watchdog += " " + c.RoleOf(h.rank) + " (rank " + std::to_string(h.rank) + ") holds " + std::to_string(h.requests) +
                  " requests, silent " + Fmt(now - last_heard[h.rank], 1) + " s;";
    }
    for (int64_t i = 0; i < N; ++i) {
      if (records[i].success && (i >= next || records[i].token_times.size() < static_cast<size_t>(in.output_len[i]))) {
        records[i].success = false;
        records[i].error = i >= next ? "never sent (job ended by the watchdog)" : "unfinished (job ended by the watchdog)";
        records[i].output_len = static_cast<int64_t>(records[i].token_times.size());
      }
    }
  }
  // Metrics JSON (vLLM keys + eldr's), per-request JSONL, summary.
  std::vector<DecoderStats> stats(c.decode_ranks);
  for (int d = 0; d < c.decode_ranks; ++d) {
    stats[d].rank = c.DecoderLeaderRank(d);
    stats[d].requests = decoder_requests[d];
    stats[d].steps = decoder_steps[d];
    stats[d].batch_sum = decoder_batch[d];
    stats[d].distinct_sum = decoder_distinct[d];
    stats[d].ep_size = c.ep_size;
    if (c.ep_size > 1) {
      std::vector<double>& bal = decoder_balancedness[d];
      const double steps = static_cast<double>(bal.size());
      stats[d].mean_rank_load = decoder_rank_load[d];
      for (double& v : stats[d].mean_rank_load) v = steps > 0 ? v / steps : 0.0;
      double sum = 0;
      for (double b : bal) sum += b;
      std::sort(bal.begin(), bal.end());
      stats[d].mean_balancedness = steps > 0 ? sum / steps : 0.0;
      stats[d].p1_balancedness = bal.empty() ? 0.0 : Percentile(bal, 1);
    }
  }
  nlohmann::json j = JobMetrics(c, mc.name, records, stats, {router.tau(), band_sum, band_n, fallbacks});
  j["kv_transport"] = kv_transport;
  if (!watchdog.empty()) j["watchdog"] = watchdog;
  ELDR_RETURN_IF_ERROR(WriteJobOutputs(c.output_dir, j, records, c.output_tokens));
  ELDR_RETURN_IF_ERROR(WriteStepLog(c.output_dir + "/steps.jsonl", step_log));
  std::printf("%s", FormatServingSummary(j).c_str());
  std::fflush(stdout);
  // Prefill ranks and decoder leaders; a leader stops its EP members.
  for (int r = 1; r <= c.prefill_ranks; ++r) tr.Send(r, kTagShutdown, nullptr, 0);
  for (int d = 0; d < c.decode_ranks; ++d) tr.Send(c.DecoderLeaderRank(d), kTagShutdown, nullptr, 0);
  if (!watchdog.empty()) return Status::FailedPrecondition(watchdog + " metrics written to " + c.output_dir);
  return Status::Ok();
}

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
    if (!mpi) return Status::FailedPrecondition(std::string("decode.ep_size > 1 needs the MPI transport, not ") + tr.name());
    group = GroupComm::Split(mpi->comm(), c.DecoderOfRank(rank), rank);
  }
  if (rank == 0) {
    std::signal(SIGTERM, OnTerminate);
    return RunRouter(c, tr, in, mc, progress, kv_name);
  }
  ELDR_ASSIGN_OR_RETURN(ModelWeights w, LoadWeights(c, mc, static_cast<int>(in.trace.Domains().size())));
  tr.Send(0, kTagReady, nullptr, 0);
  if (rank <= c.prefill_ranks) return RunPrefill(c, tr, in, w, kv_data);
  if (!group.valid()) return RunDecode(c, tr, w, placements[c.DecoderOfRank(rank)], nullptr, kv_data);
  const Placement& placement = placements[c.DecoderOfRank(rank)];
  return group.rank() == 0 ? RunDecode(c, tr, w, placement, &group, kv_data) : RunEpMember(w, placement, group);
}

}  // namespace eldr
