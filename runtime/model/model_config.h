// MoE model configuration with the field names of Hugging Face `config.json` (Qwen3-MoE / DeepSeek
// family), read from YAML (configs/models/*.yaml).
#pragma once

#include <cstdint>
#include <string>

#include "runtime/common/status.h"
#include "runtime/trace/trace.h"

namespace eldr {

struct ModelConfig {
  std::string name;
  int hidden_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  int head_dim = 0;           // default hidden_size / num_attention_heads
  int intermediate_size = 0;  // dense layers' MLP (first_k_dense_replace)
  int moe_intermediate_size = 0;
  int num_experts = 0;  // routed experts (also read as n_routed_experts)
  int num_experts_per_tok = 0;
  bool norm_topk_prob = true;
  int vocab_size = 0;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  int first_k_dense_replace = 0;        // leading dense layers
  int n_shared_experts = 0;             // shared experts, each of moe_intermediate_size
  std::string torch_dtype = "float32";  // weight storage: float32 or bfloat16

  int num_moe_layers() const { return num_hidden_layers - first_k_dense_replace; }
  bool is_moe_layer(int layer) const { return layer >= first_k_dense_replace; }
  // The routing-trace shape of this model (MoE layers only).
  TraceShape trace_shape() const { return {name, num_moe_layers(), num_experts, num_experts_per_tok}; }
  // Bytes of one routed expert's three matrices in the storage dtype.
  int64_t expert_bytes() const;
  // Total parameter count.
  int64_t num_parameters() const;
};

// Reads and validates a YAML model config; errors name the file and the field.
Result<ModelConfig> LoadModelConfig(const std::string& path);
Status ValidateModelConfig(const ModelConfig& c, const std::string& name);

}  // namespace eldr
