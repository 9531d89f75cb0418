// A decode worker (DESIGN.md §2): receives prefilled requests (their KV and first token), admits them into
// continuous batching within its max batch and KV capacity, and runs decode steps over the running batch.
// A request that does not fit waits in the worker's queue (FIFO) — none is dropped. Each admitted request
// reserves the KV blocks of its whole context (prompt + output) up front, so a running request never runs
// out of cache and nothing is preempted.
//
// Thread safety: not thread-safe; the decode rank's main loop owns it.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
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

  // Queues a request. InvalidArgument when it is malformed or could never fit (its context needs more
  // blocks than the whole cache).
  Status Submit(DecodeWork work);
  // Admits queued requests in FIFO order while a batch slot and their blocks are free, then runs one decode
  // step over the running batch. Requests with output_len 1 finish at admission (reported as done).
  Result<StepReport> Step();

  int running() const { return static_cast<int>(running_.size()); }
  int queued() const { return static_cast<int>(queue_.size()); }
  int64_t in_flight() const { return running() + queued(); }
  const BlockManager& blocks() const { return blocks_; }

 private:
  struct Sequence {
    DecodeWork work;
    std::vector<BlockId> table;
    int64_t produced = 1;  // output tokens so far (prefill's included)
    int32_t last_token = 0;
  };
  int BlocksFor(const DecodeWork& w) const;
  void Admit(std::vector<TokenEvent>* finished_at_admission);

  DecodeWorkerOptions options_;
  Executor executor_;
  BlockManager blocks_;
  std::deque<DecodeWork> queue_;
  std::vector<Sequence> running_;
};

}  // namespace eldr
