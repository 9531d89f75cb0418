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
  const std::vector<BlockId>* block_table = nullptr;  // prefill
  int start = 0;                                      // prefill: position of the first computed token
  const std::vector<DecodeSequence>* batch = nullptr; // decode
};

Executor::Executor(const ModelWeights& weights, int num_blocks, int block_size)
    : w_(weights), num_blocks_(num_blocks), block_size_(block_size), local_experts_(weights) {
  const ModelConfig& c = w_.config;
  const size_t per_layer = static_cast<size_t>(num_blocks) * block_size * c.num_key_value_heads * c.head_dim;
  k_cache_.assign(c.num_hidden_layers, std::vector<float>(per_layer, 0.f));
  v_cache_.assign(c.num_hidden_layers, std::vector<float>(per_layer, 0.f));
}

int64_t Executor::kv_bytes() const {
  return 2LL * static_cast<int64_t>(k_cache_.size()) * (k_cache_.empty() ? 0 : static_cast<int64_t>(k_cache_[0].size())) *
         static_cast<int64_t>(sizeof(float));
}

namespace {

void Embed(const kernels::WeightMatrix& table, const int32_t* tokens, int n, float* x) {
  const int64_t H = table.cols;
  for (int t = 0; t < n; ++t) {
    ELDR_CHECK(tokens[t] >= 0 && tokens[t] < table.rows, "token id " << tokens[t] << " outside the vocabulary");
    if (table.dtype == kernels::DType::kF32) {
      std::memcpy(x + t * H, static_cast<const float*>(table.data) + tokens[t] * H, H * sizeof(float));
    } else {
      const uint16_t* row = static_cast<const uint16_t*>(table.data) + tokens[t] * H;
      for (int64_t h = 0; h < H; ++h) x[t * H + h] = kernels::Bf16ToFloat(row[h]);
    }
  }
}

int32_t ArgMax(const float* v, int n) { return static_cast<int32_t>(std::max_element(v, v + n) - v); }

}  // namespace

Status Executor::Forward(float* x, int T, const int32_t* positions, const Tokens& mode, const GateReplay* replay,
                         uint16_t* topk_out) {
  const ModelConfig& c = w_.config;
  const int H = c.hidden_size, D = c.head_dim, Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
  const int E = c.num_experts, K = c.num_experts_per_tok, Lm = c.num_moe_layers();
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  std::vector<float> h(static_cast<size_t>(T) * H), q(static_cast<size_t>(T) * Hq * D),
      k(static_cast<size_t>(T) * Hkv * D), v(static_cast<size_t>(T) * Hkv * D), attn(static_cast<size_t>(T) * Hq * D),
      o(static_cast<size_t>(T) * H), logits(static_cast<size_t>(T) * E), topk_w(static_cast<size_t>(T) * K);
  std::vector<int32_t> topk_ids(static_cast<size_t>(T) * K);
  // Per-token replay pointers: [L_moe, k] blocks of ids (and weights).
  std::vector<const uint16_t*> rep_ids(T, nullptr);
  std::vector<const float*> rep_w(T, nullptr);
  if (mode.prefill) {
    if (replay && replay->ids) {
      for (int t = 0; t < T; ++t) {
        rep_ids[t] = replay->ids + static_cast<size_t>(t) * Lm * K;
        rep_w[t] = replay->weights ? replay->weights + static_cast<size_t>(t) * Lm * K : nullptr;
      }
    }
  } else {
    for (int t = 0; t < T; ++t) {
      const GateReplay* r = (*mode.batch)[t].replay;
      if (r && r->ids) {
        rep_ids[t] = r->ids;
        rep_w[t] = r->weights;
      }
    }
  }
  // Decode block tables, padded: [T, max_blocks].
  std::vector<int32_t> tables, context_lens;
  int max_blocks = 0;
  if (!mode.prefill) {
    for (const auto& s : *mode.batch) max_blocks = std::max(max_blocks, static_cast<int>(s.block_table->size()));
    tables.assign(static_cast<size_t>(T) * max_blocks, 0);
    context_lens.resize(T);
    for (int t = 0; t < T; ++t) {
      const auto& bt = *(*mode.batch)[t].block_table;
      std::copy(bt.begin(), bt.end(), tables.begin() + static_cast<size_t>(t) * max_blocks);
      context_lens[t] = (*mode.batch)[t].position + 1;
    }
  }
  int moe_index = 0;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& L = w_.layers[l];
    kernels::PagedKv cache{k_cache_[l].data(), v_cache_[l].data(), num_blocks_, block_size_, Hkv, D};
    // Attention block.
    kernels::RmsNorm({x, L.input_layernorm.data(), h.data(), T, H, static_cast<float>(c.rms_norm_eps)});
    kernels::Linear({h.data(), L.q_proj, q.data(), T});
    kernels::Linear({h.data(), L.k_proj, k.data(), T});
    kernels::Linear({h.data(), L.v_proj, v.data(), T});
    kernels::ApplyRope({q.data(), k.data(), positions, T, Hq, Hkv, D, static_cast<float>(c.rope_theta)});
    if (mode.prefill) {
      kernels::WriteKv({cache, mode.block_table->data(), positions, k.data(), v.data(), T});
      kernels::PrefillAttention({q.data(), cache, mode.block_table->data(), mode.start, T, Hq, scale, attn.data()});
    } else {
      for (int t = 0; t < T; ++t) {
        const size_t kv_off = static_cast<size_t>(t) * Hkv * D;
        kernels::WriteKv({cache, tables.data() + static_cast<size_t>(t) * max_blocks, positions + t, k.data() + kv_off,
                          v.data() + kv_off, 1});
      }
      kernels::PagedAttentionDecode(
          {q.data(), cache, tables.data(), context_lens.data(), T, Hq, max_blocks, scale, attn.data()});
    }
    kernels::Linear({attn.data(), L.o_proj, o.data(), T});
    for (size_t i = 0; i < o.size(); ++i) x[i] += o[i];
    // FFN block.
    kernels::RmsNorm({x, L.post_attention_layernorm.data(), h.data(), T, H, static_cast<float>(c.rms_norm_eps)});
    if (!c.is_moe_layer(l)) {
      kernels::Mlp({h.data(), L.mlp_gate, L.mlp_up, L.mlp_down, T, x});
      continue;
    }
    kernels::Linear({h.data(), L.router, logits.data(), T});
    kernels::GateTopK({logits.data(), T, E, K, c.norm_topk_prob, topk_ids.data(), topk_w.data()});
    for (int t = 0; t < T; ++t) {
      if (!rep_ids[t]) continue;
      const uint16_t* ids = rep_ids[t] + static_cast<size_t>(moe_index) * K;
      const float* lg = logits.data() + static_cast<size_t>(t) * E;
      const float mx = *std::max_element(lg, lg + E);
      double z = 0;
      for (int e = 0; e < E; ++e) z += std::exp(static_cast<double>(lg[e] - mx));
      double kept = 0;
      for (int j = 0; j < K; ++j) {
        topk_ids[t * K + j] = ids[j];
        const double p = rep_w[t] ? rep_w[t][static_cast<size_t>(moe_index) * K + j]
                                  : std::exp(static_cast<double>(lg[ids[j]] - mx)) / z;
        topk_w[t * K + j] = static_cast<float>(p);
        kept += p;
      }
      if (!rep_w[t] && c.norm_topk_prob && kept > 0) {
        for (int j = 0; j < K; ++j) topk_w[t * K + j] = static_cast<float>(topk_w[t * K + j] / kept);
      }
    }
    if (topk_out) {
      for (int t = 0; t < T; ++t) {
        for (int j = 0; j < K; ++j) {
          topk_out[(static_cast<size_t>(t) * Lm + moe_index) * K + j] = static_cast<uint16_t>(topk_ids[t * K + j]);
        }
      }
    }
    MoeLayerCall call;
    call.layer = l;
    call.moe_layer = moe_index;
    call.x = h.data();
    call.topk_ids = topk_ids.data();
    call.topk_weights = topk_w.data();
    call.num_tokens = T;
    call.top_k = K;
    call.out = x;
    call.batch_invariant = !mode.prefill;
    ELDR_RETURN_IF_ERROR(backend_ ? backend_->RunExperts(call) : local_experts_.RunExperts(call));
    if (c.n_shared_experts > 0) kernels::Mlp({h.data(), L.shared_gate, L.shared_up, L.shared_down, T, x});
    ++moe_index;
  }
  return Status::Ok();
}

void Executor::Logits(const float* x, int T, float* logits) {
  const ModelConfig& c = w_.config;
  std::vector<float> h(static_cast<size_t>(T) * c.hidden_size);
  kernels::RmsNorm({x, w_.norm.data(), h.data(), T, c.hidden_size, static_cast<float>(c.rms_norm_eps)});
  kernels::Linear({h.data(), w_.lm_head, logits, T});
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
    return Status::InvalidArgument("prefix hits are whole blocks: num_cached_tokens must be a multiple of the block size");
  }
  for (int32_t t : tokens) {
    if (t < 0 || t >= c.vocab_size) return Status::InvalidArgument("token id " + std::to_string(t) + " outside the vocabulary");
  }
  const int T = n - num_cached_tokens;
  const int H = c.hidden_size, Lm = c.num_moe_layers(), K = c.num_experts_per_tok;
  std::vector<float> x(static_cast<size_t>(T) * H);
  Embed(w_.embed_tokens, tokens.data() + num_cached_tokens, T, x.data());
  std::vector<int32_t> positions(T);
  for (int t = 0; t < T; ++t) positions[t] = num_cached_tokens + t;
  Tokens mode;
  mode.prefill = true;
  mode.block_table = &block_table;
  mode.start = num_cached_tokens;
  PrefillResult out;
  out.topk_ids.assign(static_cast<size_t>(T) * Lm * K, 0);
  ELDR_RETURN_IF_ERROR(Forward(x.data(), T, positions.data(), mode, replay, out.topk_ids.data()));
  out.last_logits.resize(c.vocab_size);
  Logits(x.data() + static_cast<size_t>(T - 1) * H, 1, out.last_logits.data());
  out.next_token = ArgMax(out.last_logits.data(), c.vocab_size);
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
      return Status::InvalidArgument("decode sequence " + std::to_string(t) + ": its block table does not cover position " +
                                     std::to_string(s.position));
    }
    if (s.token < 0 || s.token >= c.vocab_size) {
      return Status::InvalidArgument("token id " + std::to_string(s.token) + " outside the vocabulary");
    }
    tokens[t] = s.token;
    positions[t] = s.position;
  }
  std::vector<float> x(static_cast<size_t>(T) * H);
  Embed(w_.embed_tokens, tokens.data(), T, x.data());
  Tokens mode;
  mode.prefill = false;
  mode.batch = &batch;
  DecodeResult out;
  out.topk_ids.assign(static_cast<size_t>(T) * Lm * K, 0);
  ELDR_RETURN_IF_ERROR(Forward(x.data(), T, positions.data(), mode, nullptr, out.topk_ids.data()));
  out.logits.resize(static_cast<size_t>(T) * c.vocab_size);
  Logits(x.data(), T, out.logits.data());
  out.next_tokens.resize(T);
  for (int t = 0; t < T; ++t) out.next_tokens[t] = ArgMax(out.logits.data() + static_cast<size_t>(t) * c.vocab_size, c.vocab_size);
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

void Executor::ExportKv(const std::vector<BlockId>& block_table, int num_tokens, float* packed) const {
  const ModelConfig& c = w_.config;
  const int64_t row = static_cast<int64_t>(c.num_key_value_heads) * c.head_dim;
  ELDR_CHECK(static_cast<int64_t>(block_table.size()) * block_size_ >= num_tokens, "block table too short for export");
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      const float* src = kv == 0 ? k_cache_[l].data() : v_cache_[l].data();
      float* dst = packed + (static_cast<int64_t>(l) * 2 + kv) * num_tokens * row;
      for (int t = 0; t < num_tokens; ++t) {
        const int64_t slot = static_cast<int64_t>(block_table[t / block_size_]) * block_size_ + t % block_size_;
        std::memcpy(dst + t * row, src + slot * row, row * sizeof(float));
      }
    }
  }
}

void Executor::ImportKv(const std::vector<BlockId>& block_table, int num_tokens, const float* packed) {
  const ModelConfig& c = w_.config;
  const int64_t row = static_cast<int64_t>(c.num_key_value_heads) * c.head_dim;
  ELDR_CHECK(static_cast<int64_t>(block_table.size()) * block_size_ >= num_tokens, "block table too short for import");
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      float* dst = kv == 0 ? k_cache_[l].data() : v_cache_[l].data();
      const float* src = packed + (static_cast<int64_t>(l) * 2 + kv) * num_tokens * row;
      for (int t = 0; t < num_tokens; ++t) {
        const BlockId b = block_table[t / block_size_];
        ELDR_CHECK(b >= 0 && b < num_blocks_, "KV block " << b << " out of range");
        const int64_t slot = static_cast<int64_t>(b) * block_size_ + t % block_size_;
        std::memcpy(dst + slot * row, src + t * row, row * sizeof(float));
      }
    }
  }
}

}  // namespace eldr
