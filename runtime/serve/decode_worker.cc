#include "runtime/serve/decode_worker.h"

#include <algorithm>
#include <utility>

namespace eldr {

DecodeWorker::DecodeWorker(const ModelWeights& weights, const DecodeWorkerOptions& options)
    : options_(options),
      executor_(weights, options.num_blocks, options.block_size),
      blocks_(options.num_blocks, options.block_size) {
  executor_.set_expert_backend(options.expert_backend);
}

int DecodeWorker::BlocksFor(const DecodeWork& w) const {
  // Positions 0 .. prompt_len + output_len − 2 are written (the last output token is never an input).
  const int64_t tokens = std::max<int64_t>(1, w.prompt_len + w.output_len - 1);
  return static_cast<int>((tokens + options_.block_size - 1) / options_.block_size);
}

Status DecodeWorker::Check(const DecodeWork& w) const {
  const ModelConfig& c = executor_.config();
  const std::string where = "request " + std::to_string(w.id) + ": ";
  if (w.prompt_len < 1) return Status::InvalidArgument(where + "prompt_len must be >= 1");
  if (w.output_len < 1) return Status::InvalidArgument(where + "output_len must be >= 1");
  if (!w.forced_tokens.empty() && static_cast<int64_t>(w.forced_tokens.size()) != w.output_len) {
    return Status::InvalidArgument(where + "forced_tokens must hold output_len tokens");
  }
  const int64_t replay_len = (w.output_len - 1) * c.num_moe_layers() * c.num_experts_per_tok;
  if (!w.replay_ids.empty() && static_cast<int64_t>(w.replay_ids.size()) != replay_len) {
    return Status::InvalidArgument(where + "replay_ids must be [output_len - 1, L_moe, top_k]");
  }
  if (BlocksFor(w) > options_.num_blocks) {
    return Status::InvalidArgument(where + "needs " + std::to_string(BlocksFor(w)) + " KV blocks, the decoder has " +
                                   std::to_string(options_.num_blocks));
  }
  if (reserved_.count(w.id)) return Status::InvalidArgument(where + "offered twice");
  return Status::Ok();
}

Status DecodeWorker::Offer(DecodeWork w) {
  ELDR_RETURN_IF_ERROR(Check(w));
  if (!w.kv.empty()) return Status::InvalidArgument("request " + std::to_string(w.id) + ": an offer carries no KV");
  queue_.push_back(std::move(w));
  return Status::Ok();
}

Status DecodeWorker::Submit(DecodeWork w) {
  ELDR_RETURN_IF_ERROR(Check(w));
  if (static_cast<int64_t>(w.kv.size()) != w.prompt_len * executor_.KvFloatsPerToken()) {
    return Status::InvalidArgument("request " + std::to_string(w.id) + ": KV payload has " +
                                   std::to_string(w.kv.size()) + " floats, expected " +
                                   std::to_string(w.prompt_len * executor_.KvFloatsPerToken()));
  }
  queue_.push_back(std::move(w));
  return Status::Ok();
}

int64_t DecodeWorker::queued_kv_floats() const {
  int64_t n = 0;
  for (const DecodeWork& w : queue_) n += static_cast<int64_t>(w.kv.size());
  return n;
}

std::vector<int64_t> DecodeWorker::Reserve() {
  std::vector<int64_t> waiting_for_kv;
  while (!queue_.empty() && running() + reserved() < options_.max_batch) {
    DecodeWork& w = queue_.front();
    // output_len 1: nothing to decode, and its KV is never read; it still takes the handoff (the prefill rank
    // frees its blocks on the KV send) but no block here.
    const int need = w.output_len == 1 ? 0 : BlocksFor(w);
    if (!blocks_.CanAllocate(need)) break;  // FIFO: the head waits for blocks, nobody overtakes it
    Sequence s;
    if (need > 0) s.table = blocks_.AllocateBlocks(need).value();
    s.last_token = w.first_token;
    std::vector<float> kv = std::move(w.kv);
    s.work = std::move(w);
    queue_.pop_front();
    if (!kv.empty()) {
      Start(std::move(s), kv);
      continue;
    }
    waiting_for_kv.push_back(s.work.id);
    reserved_.emplace(s.work.id, std::move(s));
  }
  return waiting_for_kv;
}

Status DecodeWorker::Deliver(int64_t id, const std::vector<float>& kv) {
  auto it = reserved_.find(id);
  if (it == reserved_.end()) {
    return Status::InvalidArgument("request " + std::to_string(id) + ": KV delivered but no blocks are reserved");
  }
  Sequence s = std::move(it->second);
  reserved_.erase(it);
  const int64_t want = s.work.prompt_len * executor_.KvFloatsPerToken();
  if (static_cast<int64_t>(kv.size()) != want) {
    blocks_.Free(s.table);
    return Status::InvalidArgument("request " + std::to_string(id) + ": KV payload has " + std::to_string(kv.size()) +
                                   " floats, expected " + std::to_string(want));
  }
  Start(std::move(s), kv);
  return Status::Ok();
}

void DecodeWorker::Cancel(int64_t id) {
  auto it = reserved_.find(id);
  if (it == reserved_.end()) return;
  blocks_.Free(it->second.table);
  reserved_.erase(it);
}

void DecodeWorker::Start(Sequence s, const std::vector<float>& kv) {
  if (s.work.output_len == 1) {  // nothing to decode: prefill's token was the whole output
    done_.push_back({s.work.id, 0, s.work.first_token, true});
    blocks_.Free(s.table);
    return;
  }
  executor_.ImportKv(s.table, static_cast<int>(s.work.prompt_len), kv.data());
  running_.push_back(std::move(s));
}

Result<StepReport> DecodeWorker::Step() {
  StepReport rep;
  for (int64_t id : Reserve()) reserved_by_step_.push_back(id);
  rep.tokens = std::exchange(done_, {});
  if (running_.empty()) return rep;
  const ModelConfig& c = executor_.config();
  const int64_t per_token = static_cast<int64_t>(c.num_moe_layers()) * c.num_experts_per_tok;
  std::vector<DecodeSequence> batch(running_.size());
  std::vector<GateReplay> replays(running_.size());
  for (size_t i = 0; i < running_.size(); ++i) {
    Sequence& s = running_[i];
    const int64_t step = s.produced - 1;  // decode steps done so far
    const int32_t input = s.work.forced_tokens.empty() ? s.last_token : s.work.forced_tokens[step];
    batch[i].token = input;
    batch[i].position = static_cast<int32_t>(s.work.prompt_len + step);
    rep.context_tokens += batch[i].position + 1;
    batch[i].block_table = &s.table;
    if (!s.work.replay_ids.empty()) {
      replays[i].ids = s.work.replay_ids.data() + step * per_token;
      batch[i].replay = &replays[i];
    }
  }
  ELDR_ASSIGN_OR_RETURN(DecodeResult r, executor_.Decode(batch));
  rep.batch = static_cast<int>(batch.size());
  rep.distinct_experts = r.total_distinct_experts();
  rep.distinct_per_layer = r.distinct_experts;
  std::vector<Sequence> still;
  still.reserve(running_.size());
  for (size_t i = 0; i < running_.size(); ++i) {
    Sequence& s = running_[i];
    s.last_token = r.next_tokens[i];
    const int64_t index = s.produced++;
    const bool finished = s.produced >= s.work.output_len;
    rep.tokens.push_back({s.work.id, index, s.last_token, finished});
    if (finished) {
      blocks_.Free(s.table);
    } else {
      still.push_back(std::move(s));
    }
  }
  running_ = std::move(still);
  return rep;
}

}  // namespace eldr
