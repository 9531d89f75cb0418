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
// Prompt token ids: a routing trace records routing, not text, so each request's prompt token ids are
// drawn deterministically (seeded by its id) from its domain's token range of the synthetic vocabulary;
// repeated requests therefore share prefixes.
#pragma once

#include <string>

#include "runtime/comm/transport.h"
#include "runtime/serve/job_config.h"

namespace eldr {

// Runs this rank's role to completion. Rank 0 writes <output.dir>/metrics.json, requests.jsonl and prints a
// summary. Errors on any rank are returned as Status on that rank; rank 0's watchdog ends a job that stops
// making progress, naming the silent ranks.
Status RunServeJob(const JobConfig& config, Transport& transport, bool progress);

}  // namespace eldr
