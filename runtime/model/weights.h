// Model weights: synthetic (seeded, domain-structured) or loaded from a safetensors file with Hugging Face
// tensor names, memory-mapped. Big matrices are kernels::WeightMatrix views (fp32 or bf16) into storage the
// ModelWeights owns; norms are kept as fp32 vectors.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "runtime/common/status.h"
#include "runtime/model/model_config.h"

namespace eldr {

struct LayerWeights {
  std::vector<float> input_layernorm;            // [H]
  std::vector<float> post_attention_layernorm;   // [H]
  kernels::WeightMatrix q_proj, k_proj, v_proj;  // [heads * head_dim, H]
  kernels::WeightMatrix o_proj;                  // [H, q_heads * head_dim]
  // MoE layers
  kernels::WeightMatrix router;  // mlp.gate [E, H]
  kernels::ExpertWeights experts;
  kernels::WeightMatrix shared_gate, shared_up, shared_down;  // [n_shared * I, H], [H, n_shared * I]
  // dense layers
  kernels::WeightMatrix mlp_gate, mlp_up, mlp_down;
};

struct ModelWeights {
  ModelConfig config;
  kernels::WeightMatrix embed_tokens;  // [V, H]
  kernels::WeightMatrix lm_head;       // [V, H]
  std::vector<float> norm;             // [H]
  std::vector<LayerWeights> layers;    // [num_hidden_layers]
  std::shared_ptr<void> storage;       // owns what the views point into (buffers or a file mapping)
  int64_t storage_bytes = 0;
};

struct SyntheticWeightOptions {
  uint64_t seed = 0;
  int num_domains = 4;           // the vocabulary splits into this many token ranges, one per domain
  double domain_strength = 2.0;  // how strongly a domain's tokens prefer its experts
};

// Seeded weights scaled so that activations stay finite over many layers: N(0, 1/fan_in) matrices,
// residual branches damped by 1/sqrt(2·layers). Domain structure: token t of domain d = t·D/V embeds near a
// domain direction u_d, and the router row of expert e leans towards u_{e mod D}, so tokens of different
// domains prefer different experts.
Result<ModelWeights> MakeSyntheticWeights(const ModelConfig& config, const SyntheticWeightOptions& options);
// The bytes MakeSyntheticWeights allocates for `config` (its matrices in the storage dtype, its norm vectors in
// float32), in closed form without allocating; MakeSyntheticWeights checks them against the memory budget first.
double SyntheticWeightBytes(const ModelConfig& config);

// The domain whose token range contains `token` under MakeSyntheticWeights.
int SyntheticTokenDomain(const ModelConfig& config, int num_domains, int32_t token);

// Memory-maps a safetensors file and checks every tensor the config needs: present, F32 or BF16, and of the
// right shape. Errors name the file and the tensor ("model.layers.3.mlp.experts.7.up_proj.weight: shape
// [64, 32], expected [128, 32]").
Result<ModelWeights> LoadSafetensors(const ModelConfig& config, const std::string& path);

// Writes weights as safetensors (tensor names as LoadSafetensors expects), atomically.
Status WriteSafetensors(const ModelWeights& weights, const std::string& path);

}  // namespace eldr
