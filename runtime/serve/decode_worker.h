// A decode worker (DESIGN.md §2): takes prefilled requests, admits them into continuous batching within its max
// batch and KV capacity, and runs decode steps over the running batch. A request that does not fit waits in the
// worker's queue (FIFO) — none is dropped. Each admitted request reserves the KV blocks of its whole context
// (prompt + output) and its batch slot up front, so a running request never runs out of cache and nothing is
// preempted.
//
// The KV handoff (protocol.h, "KV handoff"): a request is *offered* without its KV (Offer), *reserved* when its
// blocks and batch slot are allocated (Reserve, in FIFO order; the decode rank then asks the prefill rank for the
// KV), and *delivered* when the KV arrives (Deliver), which imports it into the reserved blocks and starts it.
// So the queue holds metadata only: no KV waits on the host. Submit is the in-process shortcut for a caller that
// holds the KV already (tests, the single-process reference): offered with its KV, delivered as it is reserved.
//
// Thread safety: not thread-safe; the decode rank's main loop owns it.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "runtime/common/status.h"
#include "runtime/kvcache/block_manager.h"
#include "runtime/model/executor.h"

namespace eldr {

struct DecodeWork {
  int64_t id = 0;  // the workload request index (job/workload.h)
  int64_t prompt_len = 0;
  int64_t output_len = 0;              // output tokens in all, the first one (from prefill) included; >= 1
  int32_t first_token = 0;             // sampled by prefill
  std::vector<float> kv;               // [layers, 2, prompt_len, kv_heads, head_dim] (Executor::ExportKv)
  std::vector<int32_t> forced_tokens;  // teacher forcing: [output_len] reference outputs, or empty (greedy)
  std::vector<uint16_t> replay_ids;    // replayed routing of the decode steps [output_len - 1, L_moe, k], or empty
};

struct TokenEvent {
  int64_t id = 0;     // DecodeWork::id
  int64_t index = 0;  // output token index (1 .. output_len - 1; 0 is prefill's)
  int32_t token = 0;
  bool finished = false;  // the request's last token
};

struct StepReport {
  int batch = 0;                 // sequences in the step (0: nothing ran)
  int64_t distinct_experts = 0;  // Σ over MoE layers of |∪ top-k| (DESIGN.md §3)
  int64_t context_tokens = 0;    // Σ over the batch of the tokens attended (position + 1)
  std::vector<int32_t> distinct_per_layer;
  std::vector<TokenEvent> tokens;
};

struct DecodeWorkerOptions {
  int num_blocks = 1024;
  int block_size = BlockManager::kDefaultBlockSize;
  int max_batch = 64;
  // The routed experts of the decode steps (an EP group's leader passes its dispatching backend); nullptr:
  // computed in this process. REQUIRES: outlives the worker.
  ExpertBackend* expert_backend = nullptr;
};

class DecodeWorker {
 public:
  // REQUIRES: weights outlive the worker.
  DecodeWorker(const ModelWeights& weights, const DecodeWorkerOptions& options);

  // Queues a request whose KV comes later (work.kv empty; the offer's size is checked at Deliver).
  // InvalidArgument when it is malformed or could never fit (its context needs more blocks than the whole cache).
  Status Offer(DecodeWork work);
  // Queues a request with its KV in hand (work.kv [layers, 2, prompt_len, kv_heads, head_dim]); the same errors,
  // and a KV of the wrong size.
  Status Submit(DecodeWork work);
  // Allocates blocks and batch slots to queued requests in FIFO order while they fit (the head waits for room,
  // nobody overtakes it). A request with its KV in hand starts at once; the ids of the others, now waiting for
  // their KV, are returned (the caller asks for their KV) and also kept for TakeReserved().
  std::vector<int64_t> Reserve();
  // The ids Step()'s own Reserve() call reserved since the last call (waiting for their KV).
  std::vector<int64_t> TakeReserved() { return std::exchange(reserved_by_step_, {}); }
  // The KV of reserved request `id`: imported into its blocks, and the request runs from the next step.
  // InvalidArgument when `id` is not reserved or the KV has the wrong size (the reservation is then released).
  Status Deliver(int64_t id, const std::vector<float>& kv);
  // Releases reserved request `id` whose KV could not be used (arrived corrupted): its blocks and slot are free.
  void Cancel(int64_t id);
  // Reserve(), then one decode step over the running batch. Requests with output_len 1 finish when delivered
  // (reported as done by the next step).
  Result<StepReport> Step();

  int running() const { return static_cast<int>(running_.size()); }
  int queued() const { return static_cast<int>(queue_.size()); }
  int reserved() const { return static_cast<int>(reserved_.size()); }
  int64_t in_flight() const { return running() + queued() + reserved(); }
  // Whether Step() has something to do: a running sequence, or finished-at-delivery tokens to report.
  bool has_step_work() const { return !running_.empty() || !done_.empty(); }
  // KV floats held on the host for requests not yet running (the queue's in-hand KV: 0 on a decode rank).
  int64_t queued_kv_floats() const;
  const BlockManager& blocks() const { return blocks_; }

 private:
  struct Sequence {
    DecodeWork work;
    std::vector<BlockId> table;
    int64_t produced = 1;  // output tokens so far (prefill's included)
    int32_t last_token = 0;
  };
  int BlocksFor(const DecodeWork& w) const;
  Status Check(const DecodeWork& w) const;
  // Starts a reserved sequence whose KV is `kv` (imports it; output_len 1 finishes at once).
  void Start(Sequence s, const std::vector<float>& kv);

  DecodeWorkerOptions options_;
  Executor executor_;
  BlockManager blocks_;
  std::deque<DecodeWork> queue_;          // offered, FIFO; kv empty unless submitted in hand
  std::map<int64_t, Sequence> reserved_;  // blocks and slot allocated, waiting for the KV
  std::vector<Sequence> running_;
  std::vector<TokenEvent> done_;           // finished at delivery (output_len 1), reported by the next step
  std::vector<int64_t> reserved_by_step_;  // Step()'s reservations, for TakeReserved()
};

}  // namespace eldr
