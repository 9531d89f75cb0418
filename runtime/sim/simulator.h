// `eldr simulate` (DESIGN.md §4 sim/): a discrete-event simulation of an `eldr serve` job — the same job
// config, the same requests (job/workload.h), the same frontend and router (job/frontend.h: admission, routing
// with every policy, holding at the admission cap, accounting and the routing statistics are the very code
// serve's rank 0 runs), the same prefix cache and signature cache (kvcache/), the same decoder admission rules
// (serve/decode_worker.h) — with the model's compute replaced by a cost model (cost_model.h). It scales to what this
// machine cannot run: 40+ decoders, 100k requests.
//
// What happens to a request, in simulated time (one hop to or from the router costs control_latency):
//  1. it arrives (arrival process of the workload; max_concurrency holds it at the frontend while the
//     job has that many in flight) and goes to the prefill rank with the least outstanding requests;
//  2. the prefill rank takes requests FIFO, one at a time: it allocates the prompt's blocks in its prefix
//     cache (PromptTokens: repeated requests hit), writes the signature rows of the computed blocks from
//     the trace's prompt routing, and spends Prefill(computed tokens) (a full hit recomputes one token);
//     a prompt that does not fit waits, head of line, until shipped requests free blocks;
//  3. the counts (summed from the block rows; with route_on_decode, the request's recorded decode-token counts
//     instead: the clairvoyant ceiling) and the first token reach the router; it routes with the
//     job's policy, or holds the request while every decoder is at its admission cap;
//  4. the prefill rank ships the KV (KvTransfer(prompt KV bytes)) and frees its blocks (cached blocks stay
//     in the prefix cache);
//  5. the decoder queues it FIFO; at the start of each step it admits queued requests while a batch slot
//     and the blocks of their whole context are free, then runs one step over its batch: distinct experts
//     = Σ over MoE layers of |∪ experts| of the batch's current decode tokens, from the trace's decode
//     routing (rows wrap as in serve when output_len exceeds the recording), and the step takes
//     DecodeStep(distinct, batch, context tokens). Each sequence gets a token at the step's end;
//  6. tokens reach the frontend after control_latency; a finished request frees its blocks, and its
//     completion reaches the router (Complete) after control_latency. A failure (a prompt larger than the
//     prefill cache, a context larger than a decoder's) reaches the frontend after control_latency too, and
//     only then frees the decoder's slot and the prefill rank's outstanding count, as in serve.
// With cost.cores > 0 (ranks sharing CPU cores), prefills and decode steps share the cores (processor
// sharing: while n compute, each progresses at min(1, cores / n) of its dedicated speed).
// TTFT, TPOT, ITL and E2EL are computed from these times exactly as `eldr serve` computes them.
//
// Expert parallelism is not modelled: decode.ep_size > 1 is refused (InvalidArgument, one line).
//
// Deterministic: the same config and seed give the same result (ties in time break by event order).
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/calib/calibration.h"
#include "runtime/common/status.h"
#include "runtime/cost/cost_model.h"
#include "runtime/job/job_config.h"
#include "runtime/job/metrics.h"
#include "runtime/job/workload.h"
#include "runtime/model/model_config.h"

namespace eldr {

struct SimulationResult {
  std::vector<RequestRecord> records;  // per workload request, as `eldr serve` reports them
  std::vector<DecoderStats> decoders;  // per decoder: index, leader rank (1 + P + k, as in serve), counts
  RoutingStats routing;
  double simulated_seconds = 0;  // the job's duration in simulated time
  int64_t events = 0;            // events processed
};

// Runs the job. `calib` is required for signature policies (as for serve) and may be null otherwise.
// Requests that can never run (a prompt larger than the prefill cache, a context larger than a decoder's
// cache) are reported as failed with the reason, like serve.
// InvalidArgument for decode.ep_size > 1. `progress` shows a progress bar on a terminal.
Result<SimulationResult> Simulate(const JobConfig& config, const JobRequests& requests, const ModelConfig& model,
                                  const Calibration* calib, const CostModel& cost, bool progress);

}  // namespace eldr
