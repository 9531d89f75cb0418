#include "runtime/model/executor.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "runtime/common/check.h"
#include "runtime/common/distinct_experts.h"

namespace eldr {

int64_t DecodeResult::total_distinct_experts() const {
  int64_t s = 0;
  for (int32_t d : distinct_experts) s += d;
  return s;
}

struct Executor::Tokens {
  bool prefill = true;
  const std::vector<BlockId>* block_table = nullptr;   // prefill
  int start = 0;                                       // prefill: position of the first computed token
  const std::vector<DecodeSequence>* batch = nullptr;  // decode
};

namespace {

using kernels::Buffer;
using kernels::DType;

// A backend buffer holding a copy of host data (queued on `stream`: the host data must outlive the copy).
template <typename T>
std::unique_ptr<Buffer> Upload(kernels::Backend& b, kernels::Stream& s, const T* host, size_t n) {
  auto buf = b.Alloc(kernels::DTypeOf<T>(), static_cast<int64_t>(n));
  b.CopyHostToDevice(buf->data(), host, n * sizeof(T), s);
  return buf;
}

template <typename T>
std::unique_ptr<Buffer> Upload(kernels::Backend& b, kernels::Stream& s, const std::vector<T>& host) {
  return Upload(b, s, host.data(), host.size());
}

}  // namespace

// What a Forward call plans on the host, and its copies in backend memory.
struct Executor::Plan {
  std::vector<int64_t> slots;         // [T] KV slot of each token
  std::vector<int32_t> tables;        // prefill: the block table; decode: [T, max_blocks] padded tables
  std::vector<int32_t> context_lens;  // decode: [T]
  int max_blocks = 0;
  bool batch_invariant = false;       // decode steps ask the expert backend for batch-invariant products
  std::vector<int8_t> replay_mode;    // [T] kernels::ReplayMode; empty when no token is replayed
  std::vector<int32_t> replay_ids;    // [L_moe, T, K]
  std::vector<float> replay_weights;  // [L_moe, T, K]
  std::unique_ptr<Buffer> positions, slot_map, block_tables, lens, mode, ids, weights;
};

// Backend buffers of one Forward call.
struct Executor::Activations {
  std::unique_ptr<Buffer> h, q, k, v, attn, o, logits, topk_weights, topk_ids;
  std::vector<int32_t> host_topk_ids;  // [T, K] the current MoE layer's ids, copied back
};

Executor::Executor(const ModelWeights& weights, int num_blocks, int block_size, kernels::Backend* compute)
    : w_(weights),
      num_blocks_(num_blocks),
      block_size_(block_size),
      compute_(compute ? *compute : kernels::CpuBackend()),
      stream_(compute_.CreateStream()),
      local_experts_(weights, compute_) {
  ELDR_CHECK(compute_.host_memory(), "the executor's weights are host memory (ModelWeights); the '"
                                         << compute_.name() << "' compute backend needs device weights, which "
                                         << "are not implemented yet");
  const ModelConfig& c = w_.config;
  const int64_t per_layer = static_cast<int64_t>(num_blocks) * block_size * c.num_key_value_heads * c.head_dim;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    for (auto* cache : {&k_cache_, &v_cache_}) {
      cache->push_back(compute_.Alloc(DType::kF32, per_layer));
      compute_.MemsetZero(cache->back()->data(), cache->back()->bytes(), *stream_);
    }
  }
  compute_.SynchronizeStream(*stream_);
}

int64_t Executor::kv_bytes() const {
  int64_t bytes = 0;
  for (const auto& b : k_cache_) bytes += static_cast<int64_t>(b->bytes());
  for (const auto& b : v_cache_) bytes += static_cast<int64_t>(b->bytes());
  return bytes;
}

kernels::PagedKv Executor::Cache(int l) const {
  const ModelConfig& c = w_.config;
  return {k_cache_[l]->data(),   v_cache_[l]->data(), num_blocks_,         block_size_,
          c.num_key_value_heads, c.head_dim,          k_cache_[l]->dtype()};
}

int64_t Executor::SlotOf(const std::vector<BlockId>& block_table, int position) const {
  ELDR_CHECK(position >= 0 && static_cast<int64_t>(block_table.size()) * block_size_ > position,
             "block table of " << block_table.size() << " blocks does not cover position " << position);
  const BlockId b = block_table[position / block_size_];
  ELDR_CHECK(b >= 0 && b < num_blocks_, "KV block " << b << " out of range");
  return static_cast<int64_t>(b) * block_size_ + position % block_size_;
}

std::vector<int64_t> Executor::Slots(const std::vector<BlockId>& block_table, int num_tokens) const {
  std::vector<int64_t> slots(num_tokens);
  for (int t = 0; t < num_tokens; ++t) slots[t] = SlotOf(block_table, t);
  return slots;
}

Executor::Plan Executor::MakePlan(const std::vector<int32_t>& positions, const Tokens& mode,
                                  const GateReplay* replay) const {
  const ModelConfig& c = w_.config;
  const int T = static_cast<int>(positions.size()), K = c.num_experts_per_tok, Lm = c.num_moe_layers();
  Plan plan;
  plan.batch_invariant = !mode.prefill;
  plan.slots.resize(T);
  // Per-token replay: [L_moe, K] blocks of ids (and weights), or null.
  std::vector<const uint16_t*> rep_ids(T, nullptr);
  std::vector<const float*> rep_w(T, nullptr);
  if (mode.prefill) {
    plan.tables.assign(mode.block_table->begin(), mode.block_table->end());
    for (int t = 0; t < T; ++t) plan.slots[t] = SlotOf(*mode.block_table, positions[t]);
    for (int t = 0; replay && replay->ids && t < T; ++t) {
      rep_ids[t] = replay->ids + static_cast<size_t>(t) * Lm * K;
      rep_w[t] = replay->weights ? replay->weights + static_cast<size_t>(t) * Lm * K : nullptr;
    }
  } else {
    for (const auto& s : *mode.batch)
      plan.max_blocks = std::max(plan.max_blocks, static_cast<int>(s.block_table->size()));
    plan.tables.assign(static_cast<size_t>(T) * plan.max_blocks, 0);
    plan.context_lens.resize(T);
    for (int t = 0; t < T; ++t) {
      const DecodeSequence& s = (*mode.batch)[t];
      std::copy(s.block_table->begin(), s.block_table->end(),
                plan.tables.begin() + static_cast<size_t>(t) * plan.max_blocks);
      plan.context_lens[t] = s.position + 1;
      plan.slots[t] = SlotOf(*s.block_table, s.position);
      if (s.replay && s.replay->ids) {
        rep_ids[t] = s.replay->ids;
        rep_w[t] = s.replay->weights;
      }
    }
  }
  if (std::any_of(rep_ids.begin(), rep_ids.end(), [](const uint16_t* p) { return p != nullptr; })) {
    plan.replay_mode.assign(T, kernels::kReplayKeep);
    plan.replay_ids.assign(static_cast<size_t>(Lm) * T * K, 0);
    plan.replay_weights.assign(plan.replay_ids.size(), 0.f);
    for (int t = 0; t < T; ++t) {
      if (!rep_ids[t]) continue;
      plan.replay_mode[t] = rep_w[t] ? kernels::kReplayIdsAndWeights : kernels::kReplayIds;
      for (int m = 0; m < Lm; ++m) {
        for (int j = 0; j < K; ++j) {
          const size_t dst = (static_cast<size_t>(m) * T + t) * K + j, src = static_cast<size_t>(m) * K + j;
          plan.replay_ids[dst] = rep_ids[t][src];
          if (rep_w[t]) plan.replay_weights[dst] = rep_w[t][src];
        }
      }
    }
  }
  return plan;
}

void Executor::Attention(int l, float* x, int T, const Tokens& mode, const Plan& plan, Activations& a) {
  const ModelConfig& c = w_.config;
  const int H = c.hidden_size, D = c.head_dim, Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  const float eps = static_cast<float>(c.rms_norm_eps);
  const LayerWeights& L = w_.layers[l];
  const kernels::PagedKv cache = Cache(l);
  kernels::Backend& b = compute_;
  kernels::Stream& s = *stream_;
  float *h = a.h->As<float>(), *q = a.q->As<float>(), *k = a.k->As<float>(), *v = a.v->As<float>();
  float* attn = a.attn->As<float>();
  const int32_t* positions = plan.positions->As<int32_t>();
  const int32_t* tables = plan.block_tables->As<int32_t>();
  b.RmsNorm({x, L.input_layernorm.data(), h, T, H, eps}, s);
  b.Linear({h, L.q_proj, q, T}, s);
  b.Linear({h, L.k_proj, k, T}, s);
  b.Linear({h, L.v_proj, v, T}, s);
  b.ApplyRope({q, k, positions, T, Hq, Hkv, D, static_cast<float>(c.rope_theta)}, s);
  b.WriteKvSlots({cache, plan.slot_map->As<int64_t>(), k, v, T}, s);
  if (mode.prefill) {
    b.PrefillAttention({q, cache, tables, mode.start, T, Hq, scale, attn}, s);
  } else {
    b.PagedAttentionDecode({q, cache, tables, plan.lens->As<int32_t>(), T, Hq, plan.max_blocks, scale, attn}, s);
  }
  b.Linear({attn, L.o_proj, a.o->As<float>(), T}, s);
  b.ResidualAdd({a.o->As<float>(), x, static_cast<int64_t>(T) * H}, s);
}

Status Executor::Ffn(int l, int moe_index, float* x, int T, const Plan& plan, Activations& a, uint16_t* topk_out) {
  const ModelConfig& c = w_.config;
  const int H = c.hidden_size, E = c.num_experts, K = c.num_experts_per_tok, Lm = c.num_moe_layers();
  const LayerWeights& L = w_.layers[l];
  kernels::Backend& b = compute_;
  kernels::Stream& s = *stream_;
  float* h = a.h->As<float>();
  b.RmsNorm({x, L.post_attention_layernorm.data(), h, T, H, static_cast<float>(c.rms_norm_eps)}, s);
  if (!c.is_moe_layer(l)) {
    b.Mlp({h, L.mlp_gate, L.mlp_up, L.mlp_down, T, x}, s);
    return Status::Ok();
  }
  float* logits = a.logits->As<float>();
  int32_t* topk_ids = a.topk_ids->As<int32_t>();
  float* topk_w = a.topk_weights->As<float>();
  b.Linear({h, L.router, logits, T}, s);
  b.GateTopK({logits, T, E, K, c.norm_topk_prob, topk_ids, topk_w}, s);
  if (!plan.replay_mode.empty()) {
    const size_t layer_offset = static_cast<size_t>(moe_index) * T * K;
    b.ReplayTopK({logits, plan.mode->As<int8_t>(), plan.ids->As<int32_t>() + layer_offset,
                  plan.weights->As<float>() + layer_offset, T, E, K, c.norm_topk_prob, topk_ids, topk_w},
                 s);
  }
  // The host needs the ids: the routing output, and the dispatch plan of an EP group.
  b.CopyDeviceToHost(a.host_topk_ids.data(), topk_ids, a.host_topk_ids.size() * sizeof(int32_t), s);
  b.SynchronizeStream(s);
  if (topk_out) {
    for (int t = 0; t < T; ++t) {
      for (int j = 0; j < K; ++j) {
        topk_out[(static_cast<size_t>(t) * Lm + moe_index) * K + j] = static_cast<uint16_t>(a.host_topk_ids[t * K + j]);
      }
    }
  }
  MoeLayerCall call;
  call.layer = l;
  call.moe_layer = moe_index;
  call.x = h;
  call.topk_ids = topk_ids;
  call.host_topk_ids = a.host_topk_ids.data();
  call.topk_weights = topk_w;
  call.num_tokens = T;
  call.top_k = K;
  call.out = x;
  call.batch_invariant = plan.batch_invariant;
  call.stream = &s;
  ELDR_RETURN_IF_ERROR(expert_backend_ ? expert_backend_->RunExperts(call) : local_experts_.RunExperts(call));
  if (c.n_shared_experts > 0) b.Mlp({h, L.shared_gate, L.shared_up, L.shared_down, T, x}, s);
  return Status::Ok();
}

Status Executor::Forward(float* x, const std::vector<int32_t>& positions, const Tokens& mode, const GateReplay* replay,
                         uint16_t* topk_out) {
  const ModelConfig& c = w_.config;
  const int T = static_cast<int>(positions.size());
  const int64_t H = c.hidden_size, D = c.head_dim, Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
  const int64_t E = c.num_experts, K = c.num_experts_per_tok;
  kernels::Backend& b = compute_;
  kernels::Stream& s = *stream_;
  Plan plan = MakePlan(positions, mode, replay);
  plan.positions = Upload(b, s, positions);
  plan.slot_map = Upload(b, s, plan.slots);
  plan.block_tables = Upload(b, s, plan.tables);
  plan.lens = Upload(b, s, plan.context_lens);
  plan.mode = Upload(b, s, plan.replay_mode);
  plan.ids = Upload(b, s, plan.replay_ids);
  plan.weights = Upload(b, s, plan.replay_weights);
  Activations a;
  a.h = b.Alloc(DType::kF32, T * H);
  a.q = b.Alloc(DType::kF32, T * Hq * D);
  a.k = b.Alloc(DType::kF32, T * Hkv * D);
  a.v = b.Alloc(DType::kF32, T * Hkv * D);
  a.attn = b.Alloc(DType::kF32, T * Hq * D);
  a.o = b.Alloc(DType::kF32, T * H);
  a.logits = b.Alloc(DType::kF32, T * E);
  a.topk_weights = b.Alloc(DType::kF32, T * K);
  a.topk_ids = b.Alloc(DType::kI32, T * K);
  a.host_topk_ids.resize(static_cast<size_t>(T) * K);
  int moe_index = 0;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    Attention(l, x, T, mode, plan, a);
    ELDR_RETURN_IF_ERROR(Ffn(l, moe_index, x, T, plan, a, topk_out));
    if (c.is_moe_layer(l)) ++moe_index;
  }
  b.SynchronizeStream(s);  // the plan's host vectors die here
  return Status::Ok();
}

void Executor::Logits(const float* x, int T, float* h, float* logits) {
  const ModelConfig& c = w_.config;
  compute_.RmsNorm({x, w_.norm.data(), h, T, c.hidden_size, static_cast<float>(c.rms_norm_eps)}, *stream_);
  compute_.Linear({h, w_.lm_head, logits, T}, *stream_);
}

Result<PrefillResult> Executor::Prefill(const std::vector<int32_t>& tokens, const std::vector<BlockId>& block_table,
                                        int num_cached_tokens, const GateReplay* replay, SignatureCache* signatures) {
  const ModelConfig& c = w_.config;
  const int n = static_cast<int>(tokens.size());
  if (n == 0) return Status::InvalidArgument("prefill of an empty prompt");
  if (num_cached_tokens < 0 || num_cached_tokens >= n) {
    return Status::InvalidArgument("prefill must compute at least the last token (cached " +
                                   std::to_string(num_cached_tokens) + " of " + std::to_string(n) + ")");
  }
  if (static_cast<int64_t>(block_table.size()) * block_size_ < n) {
    return Status::InvalidArgument("the block table holds fewer slots than the prompt's tokens");
  }
  if (signatures && num_cached_tokens % block_size_ != 0) {
    return Status::InvalidArgument(
        "prefix hits are whole blocks: num_cached_tokens must be a multiple of the block size");
  }
  for (int32_t t : tokens) {
    if (t < 0 || t >= c.vocab_size)
      return Status::InvalidArgument("token id " + std::to_string(t) + " outside the vocabulary");
  }
  const int T = n - num_cached_tokens;
  const int H = c.hidden_size, Lm = c.num_moe_layers(), K = c.num_experts_per_tok;
  kernels::Stream& st = *stream_;
  auto x = compute_.Alloc(DType::kF32, static_cast<int64_t>(T) * H);
  auto d_tokens = Upload(compute_, st, tokens.data() + num_cached_tokens, T);
  compute_.EmbeddingGather({w_.embed_tokens, d_tokens->As<int32_t>(), T, x->As<float>()}, st);
  std::vector<int32_t> positions(T);
  for (int t = 0; t < T; ++t) positions[t] = num_cached_tokens + t;
  Tokens mode;
  mode.prefill = true;
  mode.block_table = &block_table;
  mode.start = num_cached_tokens;
  PrefillResult out;
  out.topk_ids.assign(static_cast<size_t>(T) * Lm * K, 0);
  ELDR_RETURN_IF_ERROR(Forward(x->As<float>(), positions, mode, replay, out.topk_ids.data()));
  auto logits = compute_.Alloc(DType::kF32, c.vocab_size);
  auto next = compute_.Alloc(DType::kI32, 1);
  auto h = compute_.Alloc(DType::kF32, H);
  Logits(x->As<float>() + static_cast<size_t>(T - 1) * H, 1, h->As<float>(), logits->As<float>());
  compute_.ArgMax({logits->As<float>(), 1, c.vocab_size, next->As<int32_t>()}, st);
  out.last_logits.resize(c.vocab_size);
  compute_.CopyDeviceToHost(out.last_logits.data(), logits->data(), logits->bytes(), st);
  compute_.CopyDeviceToHost(&out.next_token, next->data(), next->bytes(), st);
  compute_.SynchronizeStream(st);
  if (signatures) {
    for (int first = 0; first < T; first += block_size_) {
      const int count = std::min(block_size_, T - first);
      const BlockId b = block_table[(num_cached_tokens + first) / block_size_];
      signatures->WriteBlock(b, out.topk_ids.data() + static_cast<size_t>(first) * Lm * K, count, K);
    }
  }
  return out;
}

Result<DecodeResult> Executor::Decode(const std::vector<DecodeSequence>& batch) {
  const ModelConfig& c = w_.config;
  const int T = static_cast<int>(batch.size());
  if (T == 0) return Status::InvalidArgument("decode of an empty batch");
  const int H = c.hidden_size, Lm = c.num_moe_layers(), K = c.num_experts_per_tok;
  std::vector<int32_t> tokens(T), positions(T);
  for (int t = 0; t < T; ++t) {
    const auto& s = batch[t];
    if (!s.block_table || static_cast<int64_t>(s.block_table->size()) * block_size_ <= s.position) {
      return Status::InvalidArgument("decode sequence " + std::to_string(t) +
                                     ": its block table does not cover position " + std::to_string(s.position));
    }
    if (s.token < 0 || s.token >= c.vocab_size) {
      return Status::InvalidArgument("token id " + std::to_string(s.token) + " outside the vocabulary");
    }
    tokens[t] = s.token;
    positions[t] = s.position;
  }
  kernels::Stream& st = *stream_;
  auto x = compute_.Alloc(DType::kF32, static_cast<int64_t>(T) * H);
  auto d_tokens = Upload(compute_, st, tokens);
  compute_.EmbeddingGather({w_.embed_tokens, d_tokens->As<int32_t>(), T, x->As<float>()}, st);
  Tokens mode;
  mode.prefill = false;
  mode.batch = &batch;
  DecodeResult out;
  out.topk_ids.assign(static_cast<size_t>(T) * Lm * K, 0);
  ELDR_RETURN_IF_ERROR(Forward(x->As<float>(), positions, mode, nullptr, out.topk_ids.data()));
  auto logits = compute_.Alloc(DType::kF32, static_cast<int64_t>(T) * c.vocab_size);
  auto next = compute_.Alloc(DType::kI32, T);
  auto h = compute_.Alloc(DType::kF32, static_cast<int64_t>(T) * H);
  Logits(x->As<float>(), T, h->As<float>(), logits->As<float>());
  compute_.ArgMax({logits->As<float>(), T, c.vocab_size, next->As<int32_t>()}, st);
  out.logits.resize(static_cast<size_t>(T) * c.vocab_size);
  out.next_tokens.resize(T);
  compute_.CopyDeviceToHost(out.logits.data(), logits->data(), logits->bytes(), st);
  compute_.CopyDeviceToHost(out.next_tokens.data(), next->data(), next->bytes(), st);
  compute_.SynchronizeStream(st);
  // Distinct experts per MoE layer over the batch (DESIGN.md §3).
  ExpertUnion experts(Lm, c.num_experts);
  for (int t = 0; t < T; ++t) experts.AddToken(out.topk_ids.data() + static_cast<size_t>(t) * Lm * K, K);
  out.distinct_experts.resize(Lm);
  for (int l = 0; l < Lm; ++l) out.distinct_experts[l] = experts.Layer(l);
  return out;
}

int64_t Executor::KvFloatsPerToken() const {
  const ModelConfig& c = w_.config;
  return 2LL * c.num_hidden_layers * c.num_key_value_heads * c.head_dim;
}

// On a host-memory backend the layers are packed straight into the caller's buffer; otherwise through one
// staging buffer and one copy.
void Executor::ExportKv(const std::vector<BlockId>& block_table, int num_tokens, float* packed) const {
  const int64_t per_layer = KvFloatsPerToken() / w_.config.num_hidden_layers * num_tokens;
  kernels::Stream& st = *stream_;
  auto slots = Upload(compute_, st, Slots(block_table, num_tokens));
  std::unique_ptr<Buffer> staging;
  float* dst = packed;
  if (!compute_.host_memory()) {
    staging = compute_.Alloc(DType::kF32, per_layer * w_.config.num_hidden_layers);
    dst = staging->As<float>();
  }
  for (int l = 0; l < w_.config.num_hidden_layers; ++l) {
    compute_.PackKv({Cache(l), slots->As<int64_t>(), num_tokens, dst + l * per_layer}, st);
  }
  if (staging) compute_.CopyDeviceToHost(packed, dst, staging->bytes(), st);
  compute_.SynchronizeStream(st);
}

void Executor::ImportKv(const std::vector<BlockId>& block_table, int num_tokens, const float* packed) {
  const int64_t per_layer = KvFloatsPerToken() / w_.config.num_hidden_layers * num_tokens;
  kernels::Stream& st = *stream_;
  auto slots = Upload(compute_, st, Slots(block_table, num_tokens));
  std::unique_ptr<Buffer> staging;
  const float* src = packed;
  if (!compute_.host_memory()) {
    staging = Upload(compute_, st, packed, static_cast<size_t>(per_layer) * w_.config.num_hidden_layers);
    src = staging->As<float>();
  }
  for (int l = 0; l < w_.config.num_hidden_layers; ++l) {
    compute_.UnpackKv({Cache(l), slots->As<int64_t>(), num_tokens, const_cast<float*>(src + l * per_layer)}, st);
  }
  compute_.SynchronizeStream(st);
}

}  // namespace eldr
