// `eldr serve`: the PD-disaggregated serving job (DESIGN.md §2). One MPI job: rank 0 is the frontend and
// router, ranks [1, 1 + P) prefill, the rest decode. Every rank calls RunServeJob with the same config.
//
// Per request: rank 0 sends it to a prefill rank (least outstanding) when it arrives → the prefill rank
// looks up the prefix cache, prefills (gate source: the trace's routing replayed, or the model's router),
// assembles the counts from its blocks' signature rows and returns them with the first token → rank 0
// routes with the configured policy → the prefill rank ships the KV and the first token directly to the
// chosen decoder → the decoder batches it (continuous batching, queue when full) and streams tokens to
// rank 0, which stamps their arrival (the client's view, as vLLM's benchmark does).
//
// Rank 0's decisions (admission, routing, holding at the admission cap, accounting, routing statistics) are the
// job's Frontend (runtime/job/frontend.h), the same code `eldr simulate` runs. Every message between ranks is a
// struct of runtime/serve/protocol.h; a malformed one ends the receiving rank with Status::Corrupt.
//
// Prompt token ids: a routing trace records routing, not text, so each request's prompt token ids are
// drawn deterministically (seeded by its id) from its domain's token range of the synthetic vocabulary;
// repeated requests therefore share prefixes.
//
// KV handoff (protocol.h "KV handoff"): the prefill rank offers the routed request (KvOfferMsg, no KV); the decoder
// allocates its blocks and batch slot (FIFO; at once, or when finished requests free them) and only then accepts
// (KvAcceptMsg); the prefill rank sends the KV (KvMsg) and frees its own blocks when that send has completed. A
// decoder's queue holds no KV. KV transfer (kv_cache.transport, job_config.h): inside KvMsg, or with nccl KvMsg
// carries the size and checksum and the KV floats follow over NCCL point-to-point right after it; the decoder posts
// the matching receive as it handles that message, so each prefill→decoder pair's NCCL sends and receives pair up
// in order. The KV transport is made once at start, collectively, on every rank; its NCCL communicator holds the
// worker ranks only (the router needs no GPU), each on the device its compute plan chose (compute_plan.h).
//
// Decoded tokens: greedy, and equal to a single-process run that prefills each request cold and decodes it
// alone at batch 1 (tests/mpi/serve_reference.cc), whatever the batching, the prefix-cache hits and the
// topology: the CPU kernels are batch-invariant (kernels/ops.h).
//
// Reproducible routing (same config and seeds → the same decoder per request). Rank 0 routes a request when
// its prefill result arrives, with the load (in-flight requests per decoder) it sees at that moment.
//  - Load-independent policies depend only on the requests and the order in which they are routed:
//    round_robin and random (the decision sequence), locality_top1 (the nearest centroid; the load only breaks
//    exact distance ties) and domain when each domain's group is one decoder (decoders <= domains; a larger
//    group is balanced by load). With one prefill rank and routing.admission_cap 0, the routing order is the
//    request order at any request_rate and max_concurrency, so their decisions are reproducible.
//    locality_top1 and single-decoder domain groups are functions of the request alone and stay reproducible
//    with several prefill ranks; round_robin and random do not (prefill results reach rank 0 in an order that
//    depends on timing).
//  - Load-dependent policies (jsq, p2c, eldr, eldr_paper, eldr_tail) see in-flight counts that depend on when
//  completions arrive
//    relative to routing, which is inherent to load balancing: they are reproducible with max_concurrency 1
//    (one request in the system at a time, so every decision sees the same loads), not under concurrency.
//  - An admission cap makes every policy load-dependent (a decoder at its cap is not eligible).
// tests/mpi/serve_test.sh checks each of these cases across two runs.
#pragma once

#include <string>

#include "runtime/comm/transport.h"
#include "runtime/job/job_config.h"

namespace eldr {

// Runs this rank's role to completion. Rank 0 writes <output.dir>/metrics.json, requests.jsonl and prints a
// summary. Errors on any rank are returned as Status on that rank; rank 0's watchdog ends a job that stops
// making progress, naming the silent ranks.
// A Status with an empty message is one that rank 0 has already printed (PrintRankError): print nothing more.
Status RunServeJob(const JobConfig& config, Transport& transport, bool progress);

// SetupWait's floor for the ranks' agreement on the compute devices and the KV transport (CUDA and NCCL start-up).
constexpr double kDeviceStartS = 60;

// Turns SIGTERM, SIGINT and SIGHUP into a flag that the job reads (serve.cc, g_signal): called by each rank before
// MPI_Init, so that a signal at any time after it gives one line, not a silent death. During setup it fails the
// ranks' agreement on the job's inputs, and a rank blocked in setup is ended 0.5 s after the signal by a watch
// thread (128 + signal; rank 0 prints one line); once the job runs, rank 0 accounts for every request and writes
// the metrics.
void InstallServeSignalHandlers();

// Setup is over (RunServeJob calls it once the ranks agreed on the job's inputs; ServeRank on an error before): a
// signal from here on is the job's to handle. Idempotent. If the setup watch has already fired, it never returns
// (the watch is ending the process).
void EndServeSetup();

// The signal received since InstallServeSignalHandlers (SIGTERM, SIGINT, SIGHUP), 0 for none.
int ServeSignal();

// A wait of this rank on the others during setup (MPI start-up, a collective of the ranks' agreements), for as long
// as the object lives: the setup watch ends the process when one lasts longer than the setup wait limit, so that a
// rank stopped, hung or never started in setup cannot hold the others forever. Rank 0 prints one line naming
// `what` ("MPI start-up") and exits 1; the launcher then ends the others. Rank 1 gives up 2 s later and prints one
// line (rank 0 was the one stuck), unless a signal came meanwhile (the launcher ending the job after rank 0's line);
// the other ranks give up 4 s later, silently.
class SetupWait {
 public:
  // `at_least_s`: a floor under the limit, for a wait that covers the other ranks' slow local work (CUDA and NCCL
  // start-up).
  explicit SetupWait(const std::string& what, double at_least_s = 0);
  SetupWait(const SetupWait&) = delete;
  SetupWait& operator=(const SetupWait&) = delete;
  ~SetupWait();
};

// The setup wait limit: the job's watchdog_s (ServeRank sets it from the job config before MPI start-up; 120 s,
// watchdog_s's default, for a config that does not load).
void SetSetupWaitLimit(double seconds);

// One MPI_Allreduce of the ranks' outcomes of a setup step (every rank calls it), so that no rank goes on to a
// collective another has left, and an error every rank sees is printed once: rank 0 returns its own error (or
// says another rank failed); another rank returns an empty message (nothing to print) when rank 0 failed too, or
// its own error when rank 0 did not. A rank that failed after receiving a signal ("received SIGTERM while the job
// was setting up") is the only one to speak: rank 0 then returns an empty message. Not MPI: `local`.
// `what` names the step in rank 0's line when another rank failed it ("another rank could not load WHAT").
Status AgreeOnSetup(Transport& tr, const Status& local, const std::string& what = "the job's inputs");

// A serve job's error line, "eldr: error: ROLE (rank R): MESSAGE" on stderr, flushed. `rank_name` is "ROLE
// (rank R)" (JobConfig::RoleOf).
void PrintRankError(const std::string& rank_name, const std::string& message);

}  // namespace eldr
