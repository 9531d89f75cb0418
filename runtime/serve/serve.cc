#include "runtime/serve/serve.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "runtime/calib/calibration.h"
#include "runtime/comm/kv_transport.h"
#include "runtime/common/atomic_file.h"
#include "runtime/common/check.h"
#include "runtime/common/json_util.h"
#include "runtime/common/progress.h"
#include "runtime/common/signals.h"
#include "runtime/job/frontend.h"
#include "runtime/job/metrics.h"
#include "runtime/job/workload.h"
#include "runtime/kvcache/block_manager.h"
#include "runtime/kvcache/prefill_signature.h"
#include "runtime/kvcache/signature_cache.h"
#include "runtime/model/executor.h"
#include "runtime/router/router.h"
#include "runtime/serve/compute_plan.h"
#include "runtime/serve/decode_worker.h"
#include "runtime/serve/expert_parallel.h"
#include "runtime/serve/protocol.h"
#include "runtime/trace/trace.h"

namespace eldr {

namespace {

// Blocking receive that sleeps between polls: Open MPI's blocking receive spins a core, and on a node
// where ranks outnumber cores (this demo: 6 ranks, 2 cores) the spinning steals the workers' time. With
// `on_wait`, the payload is received by Transport::RecvPolling, calling it while the payload is on its way.
Message WaitMessage(Transport& tr, const std::function<void()>& on_wait = nullptr) {
  int idle = 0;
  while (!tr.Poll(Transport::kAnySource, Transport::kAnyTag)) {
    std::this_thread::sleep_for(std::chrono::microseconds(idle < 100 ? 20 : 200));
    ++idle;
  }
  return on_wait ? tr.RecvPolling(Transport::kAnySource, Transport::kAnyTag, on_wait)
                 : tr.Recv(Transport::kAnySource, Transport::kAnyTag);
}

template <typename Msg>
void SendMsg(Transport& tr, int dest, const Msg& m) {
  const std::vector<uint8_t> bytes = m.Encode();
  tr.Send(dest, Msg::kTag, bytes.data(), bytes.size());
}

// SendMsg that never blocks (Transport::Post): rank 0 sends only this way, so that a worker that stops draining
// its messages (stopped, hung) holds up its own messages and nothing else: rank 0 goes on routing, hearing the
// others and watching, and names that worker.
template <typename Msg>
void PostMsg(Transport& tr, int dest, const Msg& m) {
  tr.Post(dest, Msg::kTag, m.Encode());
}

// SendMsg calling `on_wait` while the message waits for its receiver (Transport::SendPolling).
template <typename Msg>
void SendMsgPolling(Transport& tr, int dest, const Msg& m, const std::function<void()>& on_wait) {
  const std::vector<uint8_t> bytes = m.Encode();
  tr.SendPolling(dest, Msg::kTag, bytes.data(), bytes.size(), on_wait);
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

// mpirun and srun send SIGTERM to every surviving rank a while after one rank has exited (Open MPI: SIGCONT at
// once, SIGTERM after odls_base_sigkill_timeout, 1 s by default, SIGKILL as long again), and a user may send
// SIGTERM or SIGINT. Every rank turns it into a flag. Rank 0's loop checks it every millisecond or so, asks every
// worker once more whether it lives (the dead rank is the one that does not answer) and writes the metrics it has
// within that second. A worker goes on answering for kSignalGraceS (its RouterWatch ends it then), because a
// worker that died at the SIGTERM would make Open MPI's mpirun SIGKILL rank 0 at once (it ends its wait between
// SIGTERM and SIGKILL when a rank exits). A worker's answers to rank 0's heartbeats carry its signal (Pong): a
// signal sent to one worker alone makes rank 0 end the job the same way, within that grace, and then tell every
// worker to exit (under srun, where one task's exit has every task SIGKILLed at once, that is the only way the
// metrics get written). (A signal handler can only set a flag: this and the setup state below are the
// process-wide state.) It is not signals.h's interrupt flag, which abandons a command's outputs (AtomicOutput
// refuses to commit): a serve job's signal is one to write the metrics by. InstallServeSignalHandlers takes over
// what signals.h recorded before (RecordSignalsFromStart).
volatile std::sig_atomic_t g_signal = 0;  // the signal received, 0 for none
// The first signal counts: a launcher's second one (eldr-launch's guard after a trap's, mpirun's SIGTERM after a
// Ctrl-C) must not change the reason or the exit code.
extern "C" void OnTerminate(int sig) {
  if (g_signal == 0) g_signal = sig;
}

const char* SignalName(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGHUP ? "SIGHUP" : "SIGTERM"; }

// A worker's answer to rank 0's heartbeat.
HeartbeatMsg Pong() { return HeartbeatMsg{static_cast<int32_t>(g_signal)}; }

// A worker told by rank 0 that the job failed leaves at once, without MPI_Finalize (a peer may be dead): 1, or
// 128 + the signal it received.
[[noreturn]] void ExitFailedWorker() {
  std::fflush(nullptr);
  std::_Exit(g_signal ? 128 + g_signal : 1);
}

// Setup (MPI start-up to the ranks' agreement on the job's inputs): a signal there fails that agreement, one line.
// A rank blocked in setup (in MPI_Init, a collective with a rank that is stuck, a read on a dead file system) never
// gets there: the setup watch ends rank 0 kSetupSignalGraceS after the signal, with one line, before mpirun's
// SIGKILL a second after its SIGTERM, and any other rank silently kSignalGraceS after it. Whichever comes first, the
// end of setup or the watch, wins (g_setup_state).
constexpr double kSetupSignalGraceS = 0.5;
enum SetupState : int { kSettingUp = 0, kSetupOver = 1, kSetupWatchFired = 2 };
std::atomic<int> g_setup_state{kSettingUp};

// SetupWait: when this rank began to wait on the others (0: not waiting), on what, and for how long it may.
std::mutex g_setup_wait_mutex;
double g_setup_wait_since = 0;                       // guarded by g_setup_wait_mutex
double g_setup_wait_ended = 0;                       // guarded by g_setup_wait_mutex; when the last wait ended
double g_setup_wait_limit = JobConfig().watchdog_s;  // guarded by g_setup_wait_mutex; the wait's own limit
double g_watchdog_s = JobConfig().watchdog_s;        // guarded by g_setup_wait_mutex (SetSetupWaitLimit)
std::string g_setup_wait_what;                       // guarded by g_setup_wait_mutex

// Fault injection for the setup-signal tests, as a slow or a dead file system would be: before the ranks agree on
// the job's inputs, ELDR_FAULT_SLOW_SETUP_RANK=r makes rank r spend 3 s (ended early by a signal), and
// ELDR_FAULT_STUCK_SETUP_RANK=r 30 s (a signal does not end it).
void MaybeSlowSetup(int rank) {
  const auto is_rank = [rank](const char* name) {
    const char* v = std::getenv(name);
    return v != nullptr && *v != '\0' && std::atoi(v) == rank;
  };
  const bool slow = is_rank("ELDR_FAULT_SLOW_SETUP_RANK"), stuck = is_rank("ELDR_FAULT_STUCK_SETUP_RANK");
  for (int i = 0; (slow && i < 300 && !g_signal) || (stuck && i < 3000); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// "1 request", "3 requests".
std::string Requests(int64_t n) { return std::to_string(n) + (n == 1 ? " request" : " requests"); }

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// CPU time of this process (all its threads), for the step log: on a machine where ranks share cores it is a
// step's work on a dedicated core, which wall time is not.
double CpuNow() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// ---------------------------------------------------------------- liveness
// Who watches whom (README "When a rank fails"). Clocks are monotonic (steady_clock); a watcher whose own loop
// had a gap (the process was stopped or starved) moves its "last heard" times forward by the gap, so that its
// own stall is never charged to the ranks it watches.
//  - Rank 0 sends a HeartbeatMsg to every worker (EP members too) every HeartbeatInterval() and each answers it,
//    so every live one is heard from that often, idle or busy. A rank silent for watchdog_s is
//    stopped, hung, dead or blocked behind one that is: rank 0 names the ranks silent longest first, marks the
//    unfinished requests failed, writes the metrics and ends the job.
//  - Every prefill rank and decoder leader watches rank 0 from a thread of its own (RouterWatch), which works
//    while the main thread is blocked inside MPI: nothing from rank 0 for watchdog_s + kRouterGraceS, and it
//    prints one line naming rank 0 and exits 1. The grace lets rank 0, which sees a stall first, report it.
//  - Rank 0 watches itself: a gap in its own loop longer than watchdog_s means it was stopped; it says so.
constexpr double kRouterGraceS = 2;

// After a signal: how long rank 0 waits for the answers to its last heartbeats, and how long a worker goes on
// before it exits (silently, 128 + signal; mpirun has usually SIGKILLed it by then).
constexpr double kSignalPingS = 0.3;
constexpr double kSignalGraceS = 2;

// How long ago this process started (exec), from /proc/self/stat; 0 when unknown.
double SecondsSinceProcessStart() {
  std::FILE* f = std::fopen("/proc/self/stat", "r");
  if (!f) return 0;
  char buf[1024] = {};
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  const char* p = std::strrchr(buf, ')');  // field 2 (comm) may hold spaces; fields 3.. follow its ')'
  if (n == 0 || !p) return 0;
  unsigned long long start_ticks = 0;
  // Fields 3..21 skipped, field 22 = starttime in clock ticks since boot.
  if (std::sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu",
                  &start_ticks) != 1)
    return 0;
  timespec boot{};
  clock_gettime(CLOCK_BOOTTIME, &boot);
  const double since = static_cast<double>(boot.tv_sec) + 1e-9 * static_cast<double>(boot.tv_nsec) -
                       static_cast<double>(start_ticks) / static_cast<double>(::sysconf(_SC_CLK_TCK));
  return std::max(0.0, since);
}

// The setup watch (g_setup_state above), on a thread of its own from InstallServeSignalHandlers until setup ends:
// a signal, or a SetupWait past its limit.
void RunSetupWatch() {
  // A gap in this loop (10 ms sleeps) longer than kOwnStall: the process itself was stopped. Its own stop is not
  // charged to the others (the wait's start moves forward by the gap), and a stop past the wait limit means the
  // others have given up on this rank and said so: it then ends without a line of its own.
  constexpr double kOwnStall = 2;
  const double watch_start = Now();
  double signal_at = 0, last_tick = watch_start - SecondsSinceProcessStart();  // a stop before main counts too
  bool stopped_past_limit = false;
  while (g_setup_state.load() == kSettingUp) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const double now = Now(), gap = now - last_tick;
    last_tick = now;
    if (gap > kOwnStall) {
      std::lock_guard<std::mutex> lock(g_setup_wait_mutex);
      if (g_setup_wait_since > 0) g_setup_wait_since += gap;
      if (gap > g_setup_wait_limit) stopped_past_limit = true;
    }
    if (g_signal && signal_at == 0) signal_at = now;
    // Rank 0 leaves first: were a worker to exit first, mpirun would SIGKILL rank 0 before its line. Rank 1 reports
    // a wait that rank 0 did not end (rank 0 is the one stuck): one line per job, as RouterWatch's.
    const int rank = LauncherRank();
    const bool rank0 = rank <= 0;
    std::unique_lock<std::mutex> lock(g_setup_wait_mutex);
    // Rank 0 first, rank 1 kSignalGraceS later, the others later still, so that rank 1 speaks before another
    // rank's exit has the launcher end the job (their waits may start a second apart on a loaded machine).
    const double since = g_setup_wait_since, limit = g_setup_wait_limit + (rank0       ? 0
                                                                           : rank == 1 ? kSignalGraceS
                                                                                       : 2 * kSignalGraceS);
    const std::string what = g_setup_wait_what;
    // Out of any wait (in its own work: a read, a stuck step) for longer than the others wait for it: they have
    // given up on this rank, and rank 1 has said so.
    const bool given_up_on =
        since == 0 && now - std::max(g_setup_wait_ended, watch_start) > g_setup_wait_limit + kSignalGraceS;
    lock.unlock();
    const bool waited_out = since > 0 && now - since > limit;
    const bool signalled = signal_at > 0 && now - signal_at >= (rank0 ? kSetupSignalGraceS : kSignalGraceS);
    if (!waited_out && !signalled) continue;
    int expected = kSettingUp;
    if (!g_setup_state.compare_exchange_strong(expected, kSetupWatchFired)) return;
    if (stopped_past_limit || (rank0 && given_up_on)) {
      // said by another rank already (rank 1 of rank 0, rank 0 of the others)
    } else if (rank0 && signalled) {
      std::fprintf(stderr,
                   "eldr: error: rank 0: received %s while the job was setting up, and setup did not end within "
                   "%.1f s (blocked in MPI start-up, a collective with another rank or a file read): stopped before "
                   "any request was accepted; nothing was written\n",
                   SignalName(g_signal), kSetupSignalGraceS);
    } else if (rank0) {
      std::fprintf(stderr,
                   "eldr: error: rank 0: waited %.1f s (watchdog_s) for the other ranks in %s: one of them is stopped, "
                   "hung or never started (or is slower than that: raise watchdog_s); stopped before any request was "
                   "accepted; nothing was written\n",
                   now - since, what.c_str());
    } else if (rank == 1 && !g_signal) {  // a signal: the launcher is ending the job after rank 0 has spoken
      std::fprintf(stderr,
                   "eldr: error: rank 1: waited %.1f s (watchdog_s + %.0f s) for the other ranks in %s, and rank 0 did "
                   "not end the job: rank 0 is stopped, hung or never started (or slower than that: raise "
                   "watchdog_s); nothing was written\n",
                   now - since, kSignalGraceS, what.c_str());
    }
    std::fflush(nullptr);
    std::_Exit(signalled ? 128 + g_signal : 1);
  }
}

double HeartbeatInterval(double watchdog_s) { return std::clamp(watchdog_s / 16, 0.02, 0.25); }

// A gap in a loop that polls every millisecond or so, beyond which the process itself was not running.
constexpr double kOwnStallS = 0.5;
constexpr double kOwnStallWorkerS = 2;  // the same for RouterWatch's 50 ms sleeps

// A worker's watch on rank 0 (see "liveness" above). Heard() is called by the main thread for every message from
// rank 0. After the job's ShutdownMsg, Finalizing() turns the watch into a deadline for MPI_Finalize, which waits
// forever on a stopped or dead peer: past it the process exits 1 silently (rank 0 has reported the job's
// failure). `report`: this rank prints the line when rank 0 goes silent (one rank does, so that a job says it
// once; the others exit 1 silently). A signal ends the process kSignalGraceS after it came. Never destroyed: it
// watches until the process exits.
class RouterWatch {
 public:
  RouterWatch(double limit_s, std::string who, bool report)
      : limit_s_(limit_s), who_(std::move(who)), report_(report), last_heard_(Now()), thread_([this] { Loop(); }) {}
  void Heard() { last_heard_ = Now(); }
  void Finalizing() {
    finalizing_ = true;
    Heard();
  }

 private:
  void Loop() {
    double last_tick = Now(), signal_at = 0;
    while (true) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      const double now = Now();
      // This process was stopped (not merely descheduled on a loaded machine, where a 50 ms sleep can last
      // a second): rank 0's silence over that time is not rank 0's fault.
      if (now - last_tick > kOwnStallWorkerS) last_heard_ = last_heard_ + (now - last_tick);
      last_tick = now;
      if (g_signal && signal_at == 0) signal_at = now;
      if (signal_at > 0 && now - signal_at > kSignalGraceS) {
        std::fflush(nullptr);
        std::_Exit(128 + g_signal);
      }
      // The ranks that do not report give rank 0 longer: when rank 1 exits the launcher continues a stopped rank 0,
      // which then writes the metrics before the others' exit has the launcher kill it (see g_signal).
      if (now - last_heard_ <= limit_s_ + (report_ ? 0 : kSignalGraceS)) continue;
      if (!finalizing_ && report_) {
        std::fprintf(stderr,
                     "eldr: error: %s: heard nothing from the router (rank 0) for %.1f s (watchdog_s + %.0f s): "
                     "rank 0 is stopped, hung or dead; giving up\n",
                     who_.c_str(), now - last_heard_, kRouterGraceS);
      }
      std::fflush(nullptr);
      std::_Exit(1);
    }
  }

  const double limit_s_;
  const std::string who_;
  const bool report_;
  std::atomic<double> last_heard_;
  std::atomic<bool> finalizing_{false};
  std::thread thread_;
};

// A worker's answer to the router's ShutdownMsg: ByeMsg, then (job_failed) exit 1 at once without MPI_Finalize,
// or let the caller return and finalize under the watch's deadline.
void SayBye(Transport& tr, RouterWatch* watch, const ShutdownMsg& m) {
  SendMsg(tr, 0, ByeMsg{});
  if (m.job_failed) ExitFailedWorker();
  if (watch) watch->Finalizing();
}

// A worker's link to rank 0 while its main thread waits on another worker: inside a collective of its EP group
// (GroupComm::SetWaitHook), a prefill rank's KV send to a decoder (Transport::SendPolling) or a decoder's
// receive of a message whose payload is still on its way (Transport::RecvPolling). It answers rank 0's
// heartbeats there, so a rank blocked on a stopped or dead peer is still heard from and rank 0's watchdog names
// the peer, not the rank waiting on it; and it leaves at once on a failed job's ShutdownMsg. A ShutdownMsg of a
// finished job (never sent while a worker has work; an EP member never gets one) is kept for the worker's loop.
class RouterLink {
 public:
  RouterLink(Transport& tr, RouterWatch* watch) : tr_(tr), watch_(watch) {}
  void OnWait() {
    while (tr_.Poll(0, kTagHeartbeat)) {
      tr_.Recv(0, kTagHeartbeat);
      if (watch_) watch_->Heard();
      SendMsg(tr_, 0, Pong());
    }
    if (!pending_shutdown_ && tr_.Poll(0, kTagShutdown)) {
      Result<ShutdownMsg> m = DecodeMsg<ShutdownMsg>(tr_.Recv(0, kTagShutdown));
      if (!m.ok() || m->job_failed) ExitFailedWorker();
      pending_shutdown_ = *m;
    }
  }
  // The ShutdownMsg received while waiting, if any (once).
  std::optional<ShutdownMsg> TakeShutdown() { return std::exchange(pending_shutdown_, std::nullopt); }

 private:
  Transport& tr_;
  RouterWatch* watch_;
  std::optional<ShutdownMsg> pending_shutdown_;
};

// model.weights: synthetic (a weights file is opened by LoadJobInputs, on every rank).
Result<ModelWeights> SyntheticJobWeights(const JobConfig& c, const ModelConfig& mc, int num_domains) {
  SyntheticWeightOptions o;
  o.seed = c.weight_seed;
  o.num_domains = std::max(1, num_domains);
  return MakeSyntheticWeights(mc, o);
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
  PrefillRank(const JobConfig& c, Transport& tr, const JobRequests& in, const ModelWeights& w, KvTransport* kv_data,
              RouterWatch* watch)
      : c_(c),
        tr_(tr),
        watch_(watch),
        link_(tr, watch),
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
      if (std::optional<ShutdownMsg> m = link_.TakeShutdown()) {  // received during a KV send
        SayBye(tr_, watch_, *m);
        return Status::Ok();
      }
      Message msg = tr_.Poll(0, kTagRoute)                          ? tr_.Recv(0, kTagRoute)
                    : tr_.Poll(Transport::kAnySource, kTagKvAccept) ? tr_.Recv(Transport::kAnySource, kTagKvAccept)
                                                                    : WaitMessage(tr_);
      if (msg.source == 0 && watch_) watch_->Heard();
      if (msg.tag == kTagHeartbeat) {
        SendMsg(tr_, 0, Pong());
        continue;
      }
      if (msg.tag == kTagShutdown) {
        ELDR_ASSIGN_OR_RETURN(ShutdownMsg m, DecodeMsg<ShutdownMsg>(msg));
        SayBye(tr_, watch_, m);
        return Status::Ok();
      }
      if (hang) HangForever();
      MaybeDie(tr_.rank());
      if (msg.tag == kTagPrefill) {
        ELDR_RETURN_IF_ERROR(OnPrefill(msg));
      } else if (msg.tag == kTagRoute) {
        ELDR_RETURN_IF_ERROR(OnRoute(msg));
      } else if (msg.tag == kTagKvAccept) {
        ELDR_RETURN_IF_ERROR(OnAccept(msg));
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
    int decoder_rank = -1;  // set when routed: the decoder it was offered to
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

  // The KV handoff (protocol.h): offer the routed request to its decoder; its blocks stay here until the decoder
  // has allocated its own and the KV has been sent.
  Status OnRoute(const Message& msg) {
    ELDR_ASSIGN_OR_RETURN(RouteMsg m, DecodeMsg<RouteMsg>(msg));
    auto it = waiting_route_.find(m.request);
    if (it == waiting_route_.end() || it->second.decoder_rank >= 0)
      return Status::FailedPrecondition("prefill: routing decision for an unknown request");
    const TraceRequest& r = in_.request(m.request);
    KvOfferMsg o;
    o.request = m.request;
    o.prompt_len = r.prompt_len;
    o.output_len = in_.output_len[m.request];
    o.first_token = it->second.first_token;
    o.kv_floats = static_cast<uint64_t>(r.prompt_len * ex_.KvFloatsPerToken());
    if (c_.replay_gates && o.output_len > 1) o.replay_ids = RoutingRows(in_.trace, r, r.prompt_len, o.output_len - 1);
    // A stopped or dead decoder never takes it: meanwhile this rank answers rank 0, which names the decoder.
    SendMsgPolling(tr_, m.decoder_rank, o, [this] { link_.OnWait(); });
    it->second.decoder_rank = m.decoder_rank;
    return Status::Ok();
  }

  // The decoder's answer to an offer: send the KV (accepted) and free the blocks once the send has completed,
  // or free them at once (refused: the decoder has reported the failure to rank 0).
  Status OnAccept(const Message& msg) {
    ELDR_ASSIGN_OR_RETURN(KvAcceptMsg m, DecodeMsg<KvAcceptMsg>(msg));
    auto it = waiting_route_.find(m.request);
    if (it == waiting_route_.end() || it->second.decoder_rank != msg.source) {
      return Status::Corrupt("prefill: rank " + std::to_string(msg.source) + " answers an offer of request " +
                             std::to_string(m.request) + " it was not made");
    }
    if (m.accepted) ELDR_RETURN_IF_ERROR(ShipKv(m.request, it->second));
    bm_.Free(it->second.blocks);
    waiting_route_.erase(it);
    while (!waiting_blocks_.empty()) {
      ELDR_ASSIGN_OR_RETURN(bool done, TryPrefill(waiting_blocks_.front()));
      if (!done) break;
      waiting_blocks_.pop_front();
    }
    return Status::Ok();
  }

  std::vector<float> ExportKv(int64_t req, const Pending& p) const {
    const int64_t prompt_len = in_.request(req).prompt_len;
    std::vector<float> kv(static_cast<size_t>(prompt_len * ex_.KvFloatsPerToken()));
    ex_.ExportKv(p.blocks, static_cast<int>(prompt_len), kv.data());
    return kv;
  }

  // Returns when the KV has left this rank's blocks: MPI's send has completed, NCCL's transfer is synchronised.
  Status ShipKv(int64_t req, const Pending& p) {
    std::vector<float> kv = ExportKv(req, p);
    KvMsg m;
    m.request = req;
    m.kv_inline = kv_data_ == nullptr;
    m.kv_floats = kv.size();
    m.kv_checksum = KvChecksum(kv);
    if (m.kv_inline) m.kv = std::move(kv);
    SendMsgPolling(tr_, p.decoder_rank, m, [this] { link_.OnWait(); });
    // Right after its control message, in the same order: the decoder posts the matching receive when it
    // handles that message, so a pair's NCCL sends and receives always pair up in order.
    if (kv_data_) ELDR_RETURN_IF_ERROR(kv_data_->SendFromHost(p.decoder_rank, kv.data(), kv.size() * sizeof(float)));
    return Status::Ok();
  }

  const JobConfig& c_;
  Transport& tr_;
  RouterWatch* watch_;
  RouterLink link_;
  const JobRequests& in_;
  KvTransport* kv_data_;
  const std::vector<std::string> domains_;
  Executor ex_;
  BlockManager bm_;
  SignatureCache sig_;
  std::map<int64_t, Pending> waiting_route_;  // prefilled: awaiting the route, then the decoder's accept
  std::deque<int64_t> waiting_blocks_;        // requests whose prompt does not fit until KV is shipped
};

// ---------------------------------------------------------------- decode rank
// Receives prefilled requests, batches them and reports every step's tokens to rank 0. With an EP group
// (ep_size > 1) this is the group's leader: its MoE layers go through EpExpertBackend, and it stops the members
// when rank 0 shuts it down. `kv_data`: the KV data plane (NCCL), or null when the KV comes inside the KvMsg.
// `link` answers rank 0's heartbeats while this rank waits: in its group's collectives and while a message's
// payload is on its way (a prefill rank that dies in the middle of a KvMsg leaves it waiting for ever).
class DecodeRank {
 public:
  DecodeRank(const JobConfig& c, Transport& tr, const ModelWeights& w, const Placement& placement, GroupComm* group,
             KvTransport* kv_data, RouterWatch* watch, RouterLink* link)
      : tr_(tr),
        watch_(watch),
        link_(link),
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
      // A ShutdownMsg that arrived while this rank waited (an EP collective, a message's payload) first.
      if (std::optional<ShutdownMsg> m = link_->TakeShutdown()) {
        OnShutdown(*m, &stop);
        break;
      }
      while (!stop && tr_.Poll(Transport::kAnySource, Transport::kAnyTag)) {
        ELDR_RETURN_IF_ERROR(Handle(WaitMessage(tr_, on_wait_), &stop));
      }
      if (stop) break;
      if (!worker_.has_step_work()) {  // offers wait for blocks only while sequences run: nothing to do
        Message msg = WaitMessage(tr_, on_wait_);
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
    if (msg.source == 0 && watch_) watch_->Heard();
    if (msg.tag == kTagHeartbeat) {
      SendMsg(tr_, 0, Pong());
      return Status::Ok();
    }
    if (msg.tag == kTagShutdown) {
      ELDR_ASSIGN_OR_RETURN(ShutdownMsg m, DecodeMsg<ShutdownMsg>(msg));
      OnShutdown(m, stop);
      return Status::Ok();
    }
    if (hang_) HangForever();
    MaybeDie(tr_.rank());
    if (msg.tag == kTagKvOffer) return OnOffer(msg);
    return OnKv(msg);
  }

  // The KV handoff (protocol.h): an offer is queued as metadata; blocks are allocated in FIFO order (now, or when
  // finished requests free them) and only then is the KV asked for.
  Status OnOffer(const Message& msg) {
    ELDR_ASSIGN_OR_RETURN(KvOfferMsg m, DecodeMsg<KvOfferMsg>(msg));
    if (m.prompt_len < 0 || m.kv_floats != static_cast<uint64_t>(m.prompt_len * kv_floats_per_token_)) {
      return Status::Corrupt("decode: request " + std::to_string(m.request) + " announces " +
                             std::to_string(m.kv_floats) + " KV floats for a prompt of " +
                             std::to_string(m.prompt_len));
    }
    if (offers_.count(m.request)) {
      return Status::Corrupt("decode: request " + std::to_string(m.request) + " offered twice");
    }
    const Status st =
        worker_.Offer({m.request, m.prompt_len, m.output_len, m.first_token, {}, {}, std::move(m.replay_ids)});
    if (!st.ok()) {  // never fits: rank 0 counts it failed, the prefill rank frees its blocks
      SendMsg(tr_, 0, FailedMsg{m.request, st.message()});
      SendMsg(tr_, msg.source, KvAcceptMsg{m.request, false});
      return Status::Ok();
    }
    offers_[m.request] = msg.source;
    Accept(worker_.Reserve());
    return Status::Ok();
  }

  // Asks the prefill ranks for the KV of requests whose blocks are now allocated.
  void Accept(const std::vector<int64_t>& ids) {
    for (int64_t id : ids) SendMsg(tr_, offers_.at(id), KvAcceptMsg{id, true});
  }

  // The KV of an accepted request, into the blocks reserved for it.
  Status OnKv(const Message& msg) {
    ELDR_ASSIGN_OR_RETURN(KvMsg m, DecodeMsg<KvMsg>(msg));
    auto it = offers_.find(m.request);
    if (it == offers_.end() || it->second != msg.source) {
      return Status::Corrupt("decode: KV of request " + std::to_string(m.request) + " from rank " +
                             std::to_string(msg.source) + ", which did not offer it");
    }
    offers_.erase(it);
    if (m.kv_inline == (kv_data_ != nullptr)) {
      return Status::Corrupt("decode: the KV of request " + std::to_string(m.request) +
                             (m.kv_inline ? " came inline, expected over the KV transport" : " is not inline"));
    }
    if (kv_data_) {
      // Posted before anything else is handled: the sender's transfer follows this message (PrefillRank::ShipKv).
      m.kv.resize(m.kv_floats);
      ELDR_RETURN_IF_ERROR(kv_data_->RecvToHost(msg.source, m.kv.data(), m.kv.size() * sizeof(float)));
    }
    Status st = KvChecksum(m.kv) == m.kv_checksum ? worker_.Deliver(m.request, m.kv)
                                                  : Status::Corrupt("KV blocks arrived corrupted (checksum mismatch)");
    if (!st.ok()) {
      worker_.Cancel(m.request);  // (Deliver has released them already on its own errors)
      SendMsg(tr_, 0, FailedMsg{m.request, st.message()});
      Accept(worker_.Reserve());  // its blocks are free again
    }
    return Status::Ok();
  }

  // A failed job's EP members get their own ShutdownMsg from rank 0 (and one of them may be dead): not stopped here.
  void OnShutdown(const ShutdownMsg& m, bool* stop) {
    SayBye(tr_, watch_, m);
    *stop = true;
  }

  Status StepAndReport() {
    ELDR_ASSIGN_OR_RETURN(StepReport rep, worker_.Step());
    Accept(worker_.TakeReserved());
    Accept(worker_.Reserve());  // blocks the step's finished requests freed
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
  RouterWatch* watch_;
  RouterLink* link_;
  const std::function<void()> on_wait_ = [this] { link_->OnWait(); };  // while a message's payload is on its way
  KvTransport* kv_data_;
  const int64_t kv_floats_per_token_;  // Executor::KvFloatsPerToken
  std::map<int64_t, int> offers_;      // request → the prefill rank that offered it, until its KV arrives
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
  RouterRank(const JobConfig& c, Transport& tr, const JobRequests& in, const ModelConfig& mc, const char* kv_transport,
             std::string compute)
      : c_(c),
        tr_(tr),
        in_(in),
        mc_(mc),
        kv_transport_(kv_transport),
        compute_(std::move(compute)),
        last_heard_(tr.size(), 0),
        bye_(tr.size(), false) {
    for (int r = 1; r <= c_.prefill_ranks; ++r) talkers_.push_back(r);
    for (int d = 0; d < c_.decode_ranks; ++d) talkers_.push_back(c_.DecoderLeaderRank(d));
    for (int r = 1; r < tr.size(); ++r) watched_.push_back(r);
  }

  // Serves, then: every request accounted for → outputs, a bounded goodbye (every worker answers the shutdown
  // within watchdog_s) and Ok; otherwise (a silent rank, rank 0 stopped, a signal) the unfinished requests are
  // marked failed, the outputs written, the live workers told to exit, and the one-line reason returned.
  Status Run(bool progress) {
    ELDR_RETURN_IF_ERROR(CreateFrontend());
    ELDR_RETURN_IF_ERROR(WaitReady());
    ProgressBar bar("serving " + std::string(RoutingPolicyName(c_.policy)), in_.size(), progress);
    start_ = Now();
    std::fill(last_heard_.begin(), last_heard_.end(), start_);
    last_tick_ = last_ping_ = start_;
    const Status served = Serve(bar);
    if (served.ok()) bar.Finish();
    if (!served.ok()) return FailJob(served, true);
    std::string failure;
    if (frontend_->done()) {
      const Status written = WriteOutputs("");
      if (!written.ok()) return FailJob(written, true);
      ShutdownWorkers(false);
      if (WaitBye()) return Status::Ok();
      failure = StopReport("shutdown: ");
    } else {
      if (stop_ == Stop::kSignal) PingAfterSignal();
      failure = StopReport("");
      const std::string cause = StopCause() + "; metrics.json's reason says more";
      frontend_->AbandonUnfinished("never sent (" + cause + ")", "unfinished (" + cause + ")");
      if (stop_ == Stop::kSignal || stop_ == Stop::kWorkerSignal) {
        // The launcher SIGKILLs rank 0 a second after its SIGTERM (odls_base_sigkill_timeout), and the ping took
        // 0.3 s of it; a worker that received a signal exits kSignalGraceS after it: the line naming the failed
        // rank goes out before the outputs are written, so that a slow disk or a starved core costs the metrics at
        // worst, never the line. A failed write is a second line. A worker's own signal: the others are then told
        // to exit (a launcher's signal has reached every rank already).
        PrintRankError(RankName(0), failure + "; writing the metrics to " + c_.output_dir);
        const Status written = WriteOutputs(failure);
        return FailJob(written.ok() ? Status(StatusCode::kFailedPrecondition, "") : written,
                       stop_ == Stop::kWorkerSignal && !g_signal);
      }
    }
    Status result = WriteOutputs(failure);
    if (result.ok()) result = Status::FailedPrecondition(failure + "; metrics written to " + c_.output_dir);
    // Stopped so long that the workers have given up on rank 0 and rank 1 has said so: one line per job.
    if (stop_ == Stop::kRouterStalled && router_gap_ > c_.watchdog_s + kRouterGraceS - HeartbeatInterval(c_.watchdog_s))
      result = Status(StatusCode::kFailedPrecondition, "");
    // A signal that came meanwhile: the launcher is ending every rank already, and a worker that exited now could
    // have rank 0 SIGKILLed before its line is out (see g_signal).
    return FailJob(result, !g_signal);
  }

 private:
  enum class Stop { kNone, kSilent, kRouterStalled, kSignal, kWorkerSignal };

  // watchdog_s as given: "4", "1.5".
  std::string WatchdogText() const { return Fmt(c_.watchdog_s, c_.watchdog_s == std::trunc(c_.watchdog_s) ? 0 : 2); }

  // Once per loop: notices rank 0's own stall (a gap in this loop: the time is not charged to the workers), the
  // signal flag, and a worker silent for watchdog_s; sends the heartbeats. False when the job must stop (stop_).
  bool Tick(bool ping) {
    const double now = Now(), gap = now - last_tick_;
    last_tick_ = now;
    if (gap > kOwnStallS) {
      for (double& t : last_heard_) t += gap;
      last_ping_ = 0;
      if (gap > c_.watchdog_s) {
        router_gap_ = gap;
        stop_ = Stop::kRouterStalled;
        return false;
      }
    }
    if (g_signal) {
      stop_ = Stop::kSignal;
      return false;
    }
    if (WorkerSignalled()) {
      stop_ = Stop::kWorkerSignal;
      return false;
    }
    if (ping && now - last_ping_ >= HeartbeatInterval(c_.watchdog_s)) {
      for (int r : watched_) PostMsg(tr_, r, HeartbeatMsg{});
      last_ping_ = now;
    }
    for (int r : watched_) {
      if (!bye_[r] && now - last_heard_[r] > c_.watchdog_s) {
        stop_ = Stop::kSilent;
        return false;
      }
    }
    return true;
  }

  // After a signal (mpirun sends SIGTERM about a second after a rank died, before the watchdog could notice): one
  // more heartbeat to every worker, and their answers for up to kSignalPingS; a rank that does not answer is
  // dead, stopped or blocked behind one that is (StopReport names them, silent longest first). Messages that
  // arrive meanwhile are handled (a request that finishes is counted as completed).
  void PingAfterSignal() {
    ping_sent_ = Now();
    for (int r : watched_) {
      if (!bye_[r]) PostMsg(tr_, r, HeartbeatMsg{});
    }
    auto answered = [&](int r) { return bye_[r] || last_heard_[r] >= ping_sent_; };
    while (Now() - ping_sent_ < kSignalPingS && !std::all_of(watched_.begin(), watched_.end(), answered)) {
      if (!tr_.Poll(Transport::kAnySource, Transport::kAnyTag)) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        continue;
      }
      const std::optional<Message> msg = ReceiveWhile([&] { return Now() - ping_sent_ < kSignalPingS; });
      if (!msg) break;
      last_heard_[msg->source] = Now();
      (void)Handle(*msg, last_heard_[msg->source] - start_);  // the job is ending: a malformed message changes nothing
    }
  }

  // Receives the message whose header Poll has seen (source and tag as Poll's). Its payload may still be on its
  // way, and a sender stopped between the two would hold a blocking receive forever, rank 0's watchdog with it
  // (the job's line then came from rank 1's watch on rank 0, naming no one): `keep_waiting` runs meanwhile (Tick:
  // the heartbeats and the watchdog, which then names the sender); nullopt once it returns false.
  std::optional<Message> ReceiveWhile(const std::function<bool()>& keep_waiting, int source = Transport::kAnySource,
                                      int tag = Transport::kAnyTag) {
    struct GiveUp {};
    try {
      return tr_.RecvPolling(source, tag, [&] {
        if (!keep_waiting()) throw GiveUp{};
      });
    } catch (const GiveUp&) {
      return std::nullopt;
    }
  }

  // ReceiveWhile's `keep_waiting` in the serving loop: Tick (the heartbeats, the watchdog). A rank whose messages wait
  // unread meanwhile counts as heard (it answers the heartbeats; rank 0 reads them once the payload is in), so that
  // the watchdog names the sender that stopped mid-message, not every rank rank 0 did not read meanwhile. The wait
  // lasts at most that sender's watchdog_s.
  std::function<bool()> WatchWhileReceiving(bool ping) {
    return [this, ping] {
      for (int r : watched_) {
        if (tr_.Poll(r, Transport::kAnyTag)) last_heard_[r] = Now();
      }
      return Tick(ping);
    };
  }

  // A leader's goodbye covers its EP members (it stopped them).
  void MarkBye(int rank) {
    bye_[rank] = true;
    const int d = c_.DecoderOfRank(rank);
    if (d < 0 || rank != c_.DecoderLeaderRank(d)) return;
    for (int i = 1; i < c_.ep_size; ++i) bye_[rank + i] = true;
  }

  Status CreateFrontend() {
    std::unique_ptr<Calibration> calib;
    if (!c_.calibration.empty()) {
      auto cal = ReadCalibration(c_.calibration);
      if (!cal.ok()) return ForKey(c_, cal.status(), "routing.calibration", c_.calibration);
      calib = std::make_unique<Calibration>(std::move(cal).value());
    }
    FrontendActions actions;
    actions.send_to_prefill = [this](int64_t req, int p) { PostMsg(tr_, 1 + p, PrefillRequestMsg{req}); };
    actions.send_route = [this](int64_t req, int d) {
      PostMsg(tr_, 1 + frontend_->prefill_of(req), RouteMsg{req, c_.DecoderLeaderRank(d)});
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
      const auto in_time = [&] { return !g_signal && Now() - wait_start <= c_.watchdog_s; };
      if (tr_.Poll(Transport::kAnySource, kTagReady)) {
        const std::optional<Message> m = ReceiveWhile(in_time, Transport::kAnySource, kTagReady);
        if (m) {
          ELDR_RETURN_IF_ERROR(DecodeMsg<ReadyMsg>(*m).status());
          if (!ready[m->source]) ++num_ready;
          ready[m->source] = true;
          continue;
        }
      }
      // The ranks already serving watch rank 0 (RouterWatch): keep them hearing from it, and hear their signals.
      while (tr_.Poll(Transport::kAnySource, kTagHeartbeat)) {
        const std::optional<Message> m = ReceiveWhile(in_time, Transport::kAnySource, kTagHeartbeat);
        if (!m) break;
        ELDR_RETURN_IF_ERROR(OnPong(*m));
      }
      if (Now() - last_ping_ >= HeartbeatInterval(c_.watchdog_s)) {
        for (int r : watched_) {
          if (ready[r]) PostMsg(tr_, r, HeartbeatMsg{});
        }
        last_ping_ = Now();
      }
      if (g_signal || WorkerSignalled() || Now() - wait_start > c_.watchdog_s) {
        std::string missing;
        for (int r = 1; r < tr_.size(); ++r) {
          if (!ready[r]) missing += (missing.empty() ? "" : ", ") + c_.RoleOf(r) + " (rank " + std::to_string(r) + ")";
        }
        if (g_signal || WorkerSignalled())
          return FailJob(Status::FailedPrecondition(SignalCause() +
                                                    " while the ranks loaded their weights; not ready: " + missing),
                         true);
        return FailJob(
            Status::FailedPrecondition("not ready after " + Fmt(Now() - wait_start, 0) +
                                       " s (loading weights; raise watchdog_s for a large model): " + missing),
            true);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return Status::Ok();
  }

  // Until every request is accounted for, or Tick() stops it with work outstanding. Never blocks longer than a
  // poll: every message is received only once MPI_Iprobe has seen it. Errors: a malformed message.
  Status Serve(ProgressBar& bar) {
    while (!frontend_->done()) {
      if (!Tick(true)) return Status::Ok();
      // Send what has arrived (within max_concurrency and Frontend::kPrefillQueue) to the prefill rank with the
      // least outstanding work, at most kAdmitPerTick per pass: a million requests sent in one call kept rank 0 in
      // blocking sends for over a minute, with no heartbeat, until the workers' watch gave up on it. The rest
      // wait here, in order, each stamped when it was due (so its TTFT holds the wait).
      constexpr int64_t kAdmitPerTick = 256;
      const double now = Now() - start_;
      frontend_->Admit(std::min(frontend_->DueBy(now), frontend_->sent() + kAdmitPerTick), now);
      if (!tr_.Poll(Transport::kAnySource, Transport::kAnyTag)) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        continue;
      }
      const std::optional<Message> msg = ReceiveWhile(WatchWhileReceiving(true));
      if (!msg) return Status::Ok();  // Tick stopped the job (stop_)
      last_heard_[msg->source] = Now();
      ELDR_RETURN_IF_ERROR(Handle(*msg, last_heard_[msg->source] - start_));
      bar.Update(frontend_->num_done());
    }
    return Status::Ok();
  }

  // After the ShutdownMsg: true when every prefill rank and decoder leader has answered with ByeMsg, false when
  // one stays silent for watchdog_s (or rank 0 stalls, or a signal). Other messages still in flight are dropped.
  bool WaitBye() {
    while (true) {
      if (std::all_of(talkers_.begin(), talkers_.end(), [&](int r) { return bye_[r]; })) return true;
      if (!Tick(false)) return false;
      if (!tr_.Poll(Transport::kAnySource, Transport::kAnyTag)) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        continue;
      }
      const std::optional<Message> msg = ReceiveWhile(WatchWhileReceiving(false));
      if (!msg) return false;
      last_heard_[msg->source] = Now();
      if (msg->tag == kTagBye) MarkBye(msg->source);
    }
  }

  Status Handle(const Message& msg, double t) {
    switch (msg.tag) {
      case kTagCounts:
        return OnCounts(msg, t);
      case kTagTokens:
        return OnTokens(msg, t);
      case kTagFailed:
        return OnFailed(msg, t);
      case kTagHeartbeat:  // the answer to rank 0's heartbeat: being heard, and the worker's signal
        return OnPong(msg);
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
      if (tok.finished) frontend_->Finish(tok.request, t, true);
    }
    return Status::Ok();
  }

  // A worker's answer to a heartbeat: the first worker to report a signal stops the job (Tick).
  Status OnPong(const Message& msg) {
    ELDR_ASSIGN_OR_RETURN(HeartbeatMsg m, DecodeMsg<HeartbeatMsg>(msg));
    if (m.signal != 0 && signalled_rank_ < 0) {
      signalled_rank_ = msg.source;
      worker_signal_ = m.signal;
      worker_signal_at_ = Now();
    }
    return Status::Ok();
  }

  // A worker reported a signal kSignalPingS ago: a launcher's signal (mpirun's, scancel's) reaches rank 0 too, maybe
  // a little later than a worker on another node, and is then the one to name (Tick checks g_signal first). A signal
  // sent to that worker alone stops the job after this wait, well inside the worker's kSignalGraceS.
  bool WorkerSignalled() const { return signalled_rank_ >= 0 && Now() - worker_signal_at_ >= kSignalPingS; }

  // "rank 0 received SIGTERM", or the worker's signal that stopped the job (rank 0's own comes first).
  std::string SignalCause() const {
    if (stop_ == Stop::kWorkerSignal || !g_signal)
      return RankName(signalled_rank_) + " received " + SignalName(worker_signal_);
    return std::string("rank 0 received ") + SignalName(g_signal);
  }

  Status OnFailed(const Message& msg, double t) {
    ELDR_ASSIGN_OR_RETURN(FailedMsg m, DecodeMsg<FailedMsg>(msg));
    ELDR_RETURN_IF_ERROR(CheckRequest(m.request, msg.source));
    frontend_->Finish(m.request, t, false, RankName(msg.source) + ": " + m.reason);
    return Status::Ok();
  }

  std::string RankName(int rank) const { return c_.RoleOf(rank) + " (rank " + std::to_string(rank) + ")"; }

  // Why the job stopped, in a few words, for each request it leaves unfinished (StopReport's line, in metrics.json,
  // says the rest: a million records each carrying all of it made requests.jsonl 300 MB, too slow to write in the
  // second the launcher gives after a signal).
  std::string StopCause() const {
    switch (stop_) {
      case Stop::kSignal:
      case Stop::kWorkerSignal:
        return SignalCause();
      case Stop::kRouterStalled:
        return "the router (rank 0) was stopped longer than watchdog_s";
      case Stop::kSilent:
        return "watchdog: a rank was silent for watchdog_s";
      case Stop::kNone:
        break;
    }
    return "the job stopped early";
  }

  // Why the job stopped, in one line: the stalled rank first (the one silent longest: a stopped rank has been
  // silent since it stopped, while a rank blocked sending to it went silent later), then the other silent ranks
  // and the ranks holding requests. `phase` prefixes a stop during the shutdown.
  std::string StopReport(const std::string& phase) const {
    const double now = Now(), live_s = 2 * HeartbeatInterval(c_.watchdog_s) + kOwnStallS;
    // Not heard from lately, or (after a signal) not since the last heartbeat: longest silent first.
    const double heard_by = ping_sent_ > 0 ? ping_sent_ : now - live_s;
    std::vector<int> silent;
    for (int r : watched_) {
      if (!bye_[r] && last_heard_[r] < heard_by) silent.push_back(r);
    }
    std::stable_sort(silent.begin(), silent.end(), [&](int a, int b) { return last_heard_[a] < last_heard_[b]; });
    std::string report = phase;
    if (stop_ == Stop::kRouterStalled) {
      report += "the router (rank 0) itself was stopped for " + Fmt(router_gap_, 1) + " s, longer than watchdog_s (" +
                WatchdogText() + " s); the other ranks give up on it after watchdog_s + " + Fmt(kRouterGraceS, 0) +
                " s";
    } else if (stop_ == Stop::kSignal) {
      // Where a SIGTERM comes from: mpirun and srun send it about a second after a rank has exited, and when the
      // job is cancelled or interrupted.
      const char* why = g_signal == SIGTERM
                            ? " (from the launcher: a rank exited, or the job was cancelled or interrupted)"
                        : g_signal == SIGINT ? " (Ctrl-C)"
                                             : " (the terminal closed)";
      report += std::string("rank 0 received ") + SignalName(g_signal) + why;
      if (!silent.empty())
        report += "; silent longest: " + RankName(silent[0]) + ", " + Fmt(now - last_heard_[silent[0]], 1) +
                  " s, no answer to the last heartbeat";
      for (size_t i = 1; i < silent.size(); ++i) {
        report += (i == 1 ? "; also silent (likely waiting on it): " : ", ") + RankName(silent[i]) + " " +
                  Fmt(now - last_heard_[silent[i]], 1) + " s";
      }
    } else if (stop_ == Stop::kWorkerSignal) {
      report += SignalCause() + ": the job stops there, every request accounted for";
    } else if (!silent.empty()) {
      report += "watchdog: " + RankName(silent[0]) + " silent for " + Fmt(now - last_heard_[silent[0]], 1) +
                " s (watchdog_s " + WatchdogText() + "): stopped, hung or dead";
      for (size_t i = 1; i < silent.size(); ++i) {
        report += (i == 1 ? "; also silent (likely waiting on it): " : ", ") + RankName(silent[i]) + " " +
                  Fmt(now - last_heard_[silent[i]], 1) + " s";
      }
    }
    for (int p = 0; p < c_.prefill_ranks; ++p) {
      if (frontend_->prefill_outstanding(p) > 0)
        report += "; " + RankName(1 + p) + " holds " + Requests(frontend_->prefill_outstanding(p));
    }
    for (int d = 0; d < c_.decode_ranks; ++d) {
      if (frontend_->decoder_in_flight(d) > 0) {
        report += "; " + RankName(c_.DecoderLeaderRank(d)) + " holds " + Requests(frontend_->decoder_in_flight(d));
      }
    }
    return report;
  }

  // Metrics JSON (vLLM keys + eldr's), per-request JSONL and the step log, all or none, and the summary.
  // `failure`: why the job stopped early ("" when it did not); the metrics then say "incomplete": true and why.
  Status WriteOutputs(const std::string& failure) {
    nlohmann::json j =
        JobMetrics(c_, mc_.name, frontend_->records(), frontend_->DecoderStatistics(), frontend_->routing());
    j["kv_transport"] = kv_transport_;
    j["compute"] = compute_;
    j["incomplete"] = !failure.empty();
    if (!failure.empty()) {
      j["reason"] = failure;
      j["watchdog"] = failure;
    }
    ELDR_RETURN_IF_ERROR(
        WriteServeOutputs(c_.output_dir, c_.output_replace, j, frontend_->records(), c_.output_tokens, step_log_));
    std::printf("%s", FormatServingSummary(j).c_str());
    std::fflush(stdout);
    return Status::Ok();
  }

  // Ends a failed job: its line first, printed here (PrintRankError) before any worker is told to exit, since once
  // one has exited the launcher may SIGKILL rank 0 at any moment (a job with a stopped decoder was killed 66 ms
  // after rank 0's summary, before its line); then, with `shutdown`, every worker is told to exit. Returns the
  // status with its message taken (printed: serve_cmd prints nothing more).
  Status FailJob(const Status& st, bool shutdown) {
    if (!st.message().empty()) PrintRankError(RankName(0), st.message());
    if (shutdown) ShutdownWorkers(true);
    return Status(st.ok() ? StatusCode::kFailedPrecondition : st.code(), "");
  }

  // Prefill ranks and decoder leaders that have not said goodbye; a leader stops its EP members. job_failed: every
  // worker, EP members too (their leader may be the failed rank), exits 1 without MPI_Finalize, as rank 0 does (a
  // stopped one does so when the launcher continues it).
  void ShutdownWorkers(bool job_failed) {
    for (int r : job_failed ? watched_ : talkers_) {
      if (!bye_[r]) PostMsg(tr_, r, ShutdownMsg{job_failed});
    }
  }

  const JobConfig& c_;
  Transport& tr_;
  const JobRequests& in_;
  const ModelConfig& mc_;
  const char* kv_transport_;
  const std::string compute_;  // "cpu" or "cuda" (compute_plan.h)
  std::optional<Frontend> frontend_;
  std::vector<StepRecord> step_log_;  // every prefill and decode step, for `eldr simulate --fit`
  std::vector<double> last_heard_;    // [world] when each rank was last heard from (Now(), rank 0's stalls excluded)
  std::vector<bool> bye_;             // [world] the rank answered the shutdown
  std::vector<int> talkers_;          // prefill ranks and decoder leaders: the ranks rank 0 talks to
  std::vector<int> watched_;          // every worker (EP members too): heartbeats and the watchdog
  double start_ = 0;
  double last_tick_ = 0, last_ping_ = 0;         // Tick(): the previous loop, the last heartbeat sent
  double router_gap_ = 0;                        // Stop::kRouterStalled: how long rank 0 was stopped
  double ping_sent_ = 0;                         // PingAfterSignal: when its heartbeats went out (0: not sent)
  int signalled_rank_ = -1, worker_signal_ = 0;  // the first worker whose heartbeat answer carried a signal
  double worker_signal_at_ = 0;                  // when rank 0 heard it
  Stop stop_ = Stop::kNone;
};

// What every rank reads before it takes its role.
struct JobInputs {
  ModelConfig mc;
  JobRequests in;
  std::vector<Placement> placements;    // [decode_ranks]
  std::optional<ModelWeights> weights;  // model.weights when it is a file (a memory map); synthetic: made later
};

// What rank `rank` will allocate by the job's sizes (DESIGN.md §2's roles): rank 0 every token's latencies; a
// prefill rank the weights, its KV cache, block table with prefix cache, and signature cache; a decode rank the
// weights, its KV cache and block table. Weights from a file are a memory map (not counted).
std::vector<MemoryPart> RankMemory(const JobConfig& c, const JobInputs& in, int rank) {
  if (rank == 0) return {OutputTokenMemory(c, in.in)};
  const ModelConfig& mc = in.mc;
  std::vector<MemoryPart> parts;
  if (c.weights == "synthetic") {
    parts.push_back(
        {"the synthetic weights of " + c.Key("model.config") + " " + c.model_config, SyntheticWeightBytes(mc)});
  }
  if (rank <= c.prefill_ranks) {
    parts.push_back({c.Key("kv_cache.prefill_blocks") + " = " + std::to_string(c.prefill_blocks),
                     BlockManager::MemoryBytes(c.prefill_blocks, c.block_size, true) +
                         SignatureCache::MemoryBytes(c.prefill_blocks, mc.num_moe_layers(), mc.num_experts) +
                         Executor::KvBytes(mc, c.prefill_blocks, c.block_size)});
  } else {
    parts.push_back({c.Key("kv_cache.decode_blocks") + " = " + std::to_string(c.decode_blocks),
                     BlockManager::MemoryBytes(c.decode_blocks, c.block_size, false) +
                         Executor::KvBytes(mc, c.decode_blocks, c.block_size)});
  }
  return parts;
}

// What the ranks on this rank's node (MPI_COMM_TYPE_SHARED) will allocate together, RankMemory of each, against
// this node's memory budget, before any rank allocates. Collective: every rank calls it; `inputs` null where they
// failed (the check is then skipped). Every rank of a node builds the same message, parts of one kind summed:
// "kv_cache.decode_blocks = 4096 on 3 ranks (12.1 GB) + ...".
Status CheckNodeMemory(MPI_Comm comm, int rank, const JobConfig& c, const JobInputs* inputs) {
  MPI_Comm node = MPI_COMM_NULL;
  ELDR_MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
  int size = 1;
  ELDR_MPI_CHECK(MPI_Comm_size(node, &size));
  std::vector<int> ranks(static_cast<size_t>(size));
  ELDR_MPI_CHECK(MPI_Allgather(&rank, 1, MPI_INT, ranks.data(), 1, MPI_INT, node));
  MPI_Comm_free(&node);
  if (inputs == nullptr) return Status::Ok();
  std::vector<std::string> order;
  std::map<std::string, std::pair<int, double>> kinds;  // what -> (ranks, bytes)
  for (int r : ranks) {
    for (const MemoryPart& p : RankMemory(c, *inputs, r)) {
      auto [it, added] = kinds.try_emplace(p.what, 0, 0.0);
      if (added) order.push_back(p.what);
      ++it->second.first;
      it->second.second += p.bytes;
    }
  }
  std::vector<MemoryPart> parts;
  for (const std::string& what : order) {
    const auto& [count, bytes] = kinds[what];
    parts.push_back({what + (count > 1 ? " on " + std::to_string(count) + " ranks" : ""), bytes});
  }
  const Status st = CheckJobMemory(parts);
  if (st.ok() || size == 1) return st;
  return Status(st.code(), "the " + std::to_string(size) + " ranks on this node: " + st.message());
}

Result<JobInputs> LoadJobInputs(const JobConfig& c) {
  auto mc = LoadModelConfig(c.model_config);
  if (!mc.ok()) return ForKey(c, mc.status(), "model.config", c.model_config);
  auto in = LoadJobRequests(c);
  if (!in.ok()) return ForKey(c, in.status(), "workload.trace", c.trace);
  ELDR_RETURN_IF_ERROR(CheckShapes(c, *mc, in->trace));
  ELDR_RETURN_IF_ERROR(CheckRunDirectory(c.output_dir, c.output_replace));  // before the run, not after it
  JobInputs inputs{std::move(mc).value(), std::move(in).value(), {}, std::nullopt};
  for (int d = 0; d < c.decode_ranks; ++d) {
    ELDR_ASSIGN_OR_RETURN(Placement p, LoadDecoderPlacement(c, inputs.mc, d));
    inputs.placements.push_back(std::move(p));
  }
  // Every rank opens and checks a weights file (a memory map: the header and the norms are read), so that a
  // missing or malformed one is agreed on and printed once, by rank 0, naming the key.
  if (c.weights != "synthetic") {
    auto w = LoadSafetensors(inputs.mc, c.weights);
    if (!w.ok()) return ForKey(c, w.status(), "model.weights", c.weights);
    inputs.weights = std::move(w).value();
  }
  return inputs;
}

// Rank 0's first line: the ranks, where they compute and why, the KV transport and each worker's GPU.
void PrintStartupLine(const JobConfig& c, const ComputePlan& plan, const char* kv_name) {
  std::string gpus;
  for (size_t r = 1; r < plan.devices.size(); ++r) {
    if (plan.devices[r] >= 0)
      gpus += (gpus.empty() ? "" : ", ") + std::to_string(r) + ":" + std::to_string(plan.devices[r]);
  }
  std::printf("eldr serve: %d ranks (router, %d prefill, %d decode x %d), compute %s (%s), kv transport %s%s\n",
              c.world_size(), c.prefill_ranks, c.decode_ranks, c.ep_size, plan.compute.c_str(), plan.why.c_str(),
              kv_name, gpus.empty() ? "" : (", rank:gpu " + gpus).c_str());
  std::fflush(stdout);
}

}  // namespace

void InstallServeSignalHandlers() {
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) std::signal(sig, OnTerminate);
  // A signal before these handlers (before main too: signals.h RecordSignalsFromStart) is this job's from here on.
  const int early = TakeInterrupt();
  if (early != 0 && g_signal == 0) g_signal = early;
  std::thread(RunSetupWatch).detach();
}

void EndServeSetup() {
  int expected = kSettingUp;
  if (g_setup_state.compare_exchange_strong(expected, kSetupOver) || expected == kSetupOver) return;
  for (;;) ::pause();  // the setup watch fired: it prints and ends the process
}

int ServeSignal() { return g_signal; }

SetupWait::SetupWait(const std::string& what, double at_least_s) {
  std::lock_guard<std::mutex> lock(g_setup_wait_mutex);
  g_setup_wait_what = what;
  g_setup_wait_limit = std::max(g_watchdog_s, at_least_s);
  g_setup_wait_since = Now();
}

SetupWait::~SetupWait() {
  std::lock_guard<std::mutex> lock(g_setup_wait_mutex);
  g_setup_wait_since = 0;
  g_setup_wait_ended = Now();
}

void SetSetupWaitLimit(double seconds) {
  std::lock_guard<std::mutex> lock(g_setup_wait_mutex);
  g_watchdog_s = seconds;
}

Status AgreeOnSetup(Transport& tr, const Status& local, const std::string& what) {
  auto* mpi = dynamic_cast<MpiTransport*>(&tr);
  if (!mpi) return local;
  const bool failed = !local.ok();
  const int mine[3] = {failed ? 1 : 0, tr.rank() == 0 && failed ? 1 : 0, failed && g_signal != 0 ? 1 : 0};
  int any[3] = {0, 0, 0};  // some rank failed, rank 0 failed, a rank that failed had received a signal
  ELDR_MPI_CHECK(MPI_Allreduce(mine, any, 3, MPI_INT, MPI_MAX, mpi->comm()));
  if (any[0] == 0) return Status::Ok();
  if (tr.rank() == 0) {
    if (!failed && any[2]) return Status(StatusCode::kFailedPrecondition, "");  // that rank's line is the job's
    return failed ? local
                  : Status::FailedPrecondition("another rank could not load " + what + " (its own line says why)");
  }
  if (local.ok() || any[1]) return Status(local.ok() ? StatusCode::kFailedPrecondition : local.code(), "");
  return local;
}

void PrintRankError(const std::string& rank_name, const std::string& message) {
  std::fprintf(stderr, "eldr: error: %s: %s\n", rank_name.c_str(), PrintableMessage(message).c_str());
  std::fflush(stderr);
}

Status RunServeJob(const JobConfig& c, Transport& tr, bool progress) {
  ELDR_RETURN_IF_ERROR(CheckWorldSize(c, tr.size()));
  // The KV data plane, made once at start on every rank (collective for auto and nccl, so before any rank
  // takes its own path). Every rank gets the same kind or the same error, printed once.
  auto* mpi_tr = dynamic_cast<MpiTransport*>(&tr);
  if (!mpi_tr && c.kv_transport == "nccl") {
    return Status::InvalidArgument(c.path + ": kv_cache.transport nccl needs the MPI control plane, not " + tr.name());
  }
  // Where the workers compute and which GPU each uses (compute_plan.h), agreed once on every rank; the KV data
  // plane (collective for auto and nccl) then uses the same device. Rank 0 is no member of the KV transport: it
  // needs no GPU. Every rank gets the same kinds or the same error, printed once.
  ComputePlan plan;
  JobKvTransport kv;
  if (mpi_tr) {
    // The workers start CUDA and NCCL inside it while rank 0 waits: at least kDeviceStartS.
    SetupWait wait("the ranks' agreement on the compute devices and the KV transport", kDeviceStartS);
    ELDR_ASSIGN_OR_RETURN(plan, AgreeCompute(c.path, c.compute, mpi_tr->comm()));
    auto kv_or = MakeJobKvTransport(c.kv_transport, mpi_tr->comm(), plan.devices[tr.rank()], tr.rank() != 0);
    if (!kv_or.ok()) {
      const Status& st = kv_or.status();
      return Status(st.code() == StatusCode::kFailedPrecondition ? StatusCode::kInvalidArgument : st.code(),
                    c.path + ": kv_cache.transport: " + st.message());
    }
    kv = std::move(kv_or).value();
  } else {
    ELDR_ASSIGN_OR_RETURN(plan, PlanCompute(c.path, c.compute, kernels::CudaBackendCompiled(), ExecutorRunsOnCuda(),
                                            std::vector<RankDevice>(tr.size())));
  }
  // MPI carries the KV inside the control message itself (one message, as before KvTransport existed).
  KvTransport* kv_data = kv.kind == KvTransportKind::kNccl ? kv.transport.get() : nullptr;
  const char* kv_name = kv.name();
  if (tr.rank() == 0) PrintStartupLine(c, plan, kv_name);
  // Every rank loads the same inputs and checks every decoder's placement, so a bad one fails the job before it
  // starts; the ranks agree on the outcome and only rank 0 reports an error they share.
  // Rank 0 writes the run directory: it claims output.dir until the job ends, before it checks it (LoadJobInputs),
  // so that a second job given the same one is refused now, not when it commits.
  std::optional<RunDirectoryClaim> claim;
  Status claimed_status;
  if (tr.rank() == 0) {
    Result<RunDirectoryClaim> claimed = RunDirectoryClaim::Acquire(c.output_dir);
    claimed_status = claimed.status();
    if (claimed.ok()) claim.emplace(std::move(claimed).value());
  }
  Result<JobInputs> inputs = LoadJobInputs(c);
  Status loaded = !claimed_status.ok() ? claimed_status : inputs.ok() ? Status::Ok() : inputs.status();
  if (mpi_tr) {  // what this rank and the others on its node will allocate, before any of them does
    SetupWait wait("the memory check of the ranks on each node");
    const Status memory = CheckNodeMemory(mpi_tr->comm(), tr.rank(), c, inputs.ok() ? &*inputs : nullptr);
    if (loaded.ok()) loaded = memory;
  }
  MaybeSlowSetup(tr.rank());
  // A signal during setup (InstallServeSignalHandlers) ends the job here, on every rank, before any request is
  // accepted or any output written: one line from the rank that received it.
  if (loaded.ok() && g_signal) {
    loaded = Status::FailedPrecondition(std::string("received ") + SignalName(g_signal) +
                                        " while the job was setting up: stopped before any request was accepted; "
                                        "nothing was written");
  }
  Status agreed;
  {
    SetupWait wait("the ranks' agreement on the job's inputs (a rank may still be loading them)");
    agreed = AgreeOnSetup(tr, loaded, "the job's inputs or was stopped by a signal");
  }
  ELDR_RETURN_IF_ERROR(agreed);  // (ServeRank ends setup on an error)
  const ModelConfig& mc = inputs->mc;
  const JobRequests& in = inputs->in;
  const std::vector<Placement>& placements = inputs->placements;
  const int rank = tr.rank();
  // One communicator per EP group; MPI_Comm_split is collective over the whole job, so every rank calls it.
  GroupComm group;
  if (c.ep_size > 1) {
    auto* mpi = dynamic_cast<MpiTransport*>(&tr);
    if (!mpi)
      return Status::FailedPrecondition(std::string("decode.ep_size > 1 needs the MPI transport, not ") + tr.name());
    SetupWait wait("the split of the expert-parallel groups");
    group = GroupComm::Split(mpi->comm(), c.DecoderOfRank(rank), rank);
  }
  EndServeSetup();
  if (rank == 0) {
    inputs->weights.reset();  // the router needs no weights
    return RouterRank(c, tr, in, mc, kv_name, plan.compute).Run(progress);
  }
  ModelWeights w;
  if (inputs->weights) {
    w = std::move(*inputs->weights);
  } else {
    ELDR_ASSIGN_OR_RETURN(w, SyntheticJobWeights(c, mc, static_cast<int>(in.trace.Domains().size())));
  }
  SendMsg(tr, 0, ReadyMsg{});
  // Every worker watches rank 0; rank 1 alone says so when rank 0 goes silent (one line per job).
  auto* watch = new RouterWatch(c.watchdog_s + kRouterGraceS, c.RoleOf(rank) + " (rank " + std::to_string(rank) + ")",
                                rank == 1);  // never deleted: see RouterWatch
  if (rank <= c.prefill_ranks) return PrefillRank(c, tr, in, w, kv_data, watch).Run();
  const Placement& placement = placements[c.DecoderOfRank(rank)];
  RouterLink link(tr, watch);
  if (!group.valid()) return DecodeRank(c, tr, w, placement, nullptr, kv_data, watch, &link).Run();
  group.SetWaitHook([&link] { link.OnWait(); });
  if (group.rank() == 0) return DecodeRank(c, tr, w, placement, &group, kv_data, watch, &link).Run();
  const Status st = RunEpMember(w, placement, group);
  watch->Finalizing();
  return st;
}

}  // namespace eldr
