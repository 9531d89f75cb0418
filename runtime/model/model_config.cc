#include "runtime/model/model_config.h"

#include <filesystem>

#include "runtime/common/yaml.h"

namespace eldr {

int64_t ModelConfig::expert_bytes() const {
  const int64_t bytes = torch_dtype == "bfloat16" ? 2 : 4;
  return 3LL * hidden_size * moe_intermediate_size * bytes;
}

int64_t ModelConfig::num_parameters() const {
  const int64_t H = hidden_size, D = head_dim;
  const int64_t attn = H * (num_attention_heads * D) * 2 + H * (num_key_value_heads * D) * 2 + 2 * H;
  const int64_t moe =
      num_experts * 3 * H * moe_intermediate_size + num_experts * H + n_shared_experts * 3 * H * moe_intermediate_size;
  const int64_t dense = 3 * H * intermediate_size;
  return 2 * vocab_size * H + H + num_moe_layers() * (attn + moe) + first_k_dense_replace * (attn + dense);
}

Status ValidateModelConfig(const ModelConfig& c, const std::string& name) {
  auto bad = [&](const std::string& m) { return Status::InvalidArgument(name + ": " + m); };
  if (c.hidden_size <= 0) return bad("hidden_size must be positive");
  if (c.num_hidden_layers <= 0) return bad("num_hidden_layers must be positive");
  if (c.num_attention_heads <= 0 || c.num_key_value_heads <= 0) return bad("attention heads must be positive");
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return bad("num_attention_heads must be a multiple of num_key_value_heads");
  }
  if (c.head_dim <= 0 || c.head_dim % 2 != 0) return bad("head_dim must be positive and even (RoPE)");
  if (c.vocab_size <= 0) return bad("vocab_size must be positive");
  if (c.first_k_dense_replace < 0 || c.first_k_dense_replace >= c.num_hidden_layers) {
    return bad("first_k_dense_replace must be in [0, num_hidden_layers)");
  }
  if (c.first_k_dense_replace > 0 && c.intermediate_size <= 0) return bad("dense layers need intermediate_size");
  if (c.num_experts <= 0 || c.num_experts > 65535) return bad("num_experts must be in [1, 65535]");
  if (c.num_experts_per_tok <= 0 || c.num_experts_per_tok > c.num_experts) {
    return bad("num_experts_per_tok must be in [1, num_experts]");
  }
  if (c.moe_intermediate_size <= 0) return bad("moe_intermediate_size must be positive");
  if (c.n_shared_experts < 0) return bad("n_shared_experts must be >= 0");
  if (!(c.rope_theta > 0) || !(c.rms_norm_eps > 0)) return bad("rope_theta and rms_norm_eps must be positive");
  if (c.torch_dtype != "float32" && c.torch_dtype != "bfloat16") return bad("torch_dtype must be float32 or bfloat16");
  return Status::Ok();
}

Result<ModelConfig> LoadModelConfig(const std::string& path) {
  ELDR_ASSIGN_OR_RETURN(const YAML::Node y, LoadYamlFile(path, "a model config"));
  ModelConfig c;
  YamlMap m(path, y, "", NullValues::kAbsent);  // a Hugging Face config.json writes null for "unset"
  const IntRange positive = IntRange::AtLeast(1), count = IntRange::AtLeast(0);
  c.name = std::filesystem::path(path).stem().string();
  std::string model_type;
  m.Get("model_type", &model_type);
  m.Get("name", &c.name);
  if (c.name.empty()) c.name = model_type;
  m.Get("hidden_size", &c.hidden_size, positive);
  m.Get("num_hidden_layers", &c.num_hidden_layers, positive);
  m.Get("num_attention_heads", &c.num_attention_heads, positive);
  m.Get("num_key_value_heads", &c.num_key_value_heads, positive);
  if (c.num_key_value_heads == 0) c.num_key_value_heads = c.num_attention_heads;
  m.Get("head_dim", &c.head_dim, positive);
  if (c.head_dim == 0 && c.num_attention_heads > 0) c.head_dim = c.hidden_size / c.num_attention_heads;
  m.Get("intermediate_size", &c.intermediate_size, count);
  m.Get("moe_intermediate_size", &c.moe_intermediate_size, positive);
  // Hugging Face spells the routed expert count three ways; exactly one is required.
  int given = 0;
  for (const char* key : {"num_experts", "n_routed_experts", "num_local_experts"}) {
    if (m.Has(key)) ++given;
    m.Get(key, &c.num_experts, IntRange::Between(1, 65535));
  }
  if (given > 1)
    return Status::InvalidArgument(path + ": give one of num_experts, n_routed_experts, num_local_experts");
  m.Get("num_experts_per_tok", &c.num_experts_per_tok, positive);
  m.Get("vocab_size", &c.vocab_size, positive);
  m.Get("first_k_dense_replace", &c.first_k_dense_replace, count);
  m.Get("n_shared_experts", &c.n_shared_experts, count);
  m.Get("rope_theta", &c.rope_theta, NumberRange::Above(0));
  m.Get("rms_norm_eps", &c.rms_norm_eps, NumberRange::Above(0));
  m.Get("norm_topk_prob", &c.norm_topk_prob);
  m.Get("torch_dtype", &c.torch_dtype, {"float32", "bfloat16"});
  // After the values, so that a bad value is reported before another key's absence.
  for (const char* key : {"hidden_size", "num_hidden_layers", "num_attention_heads", "moe_intermediate_size",
                          "num_experts_per_tok", "vocab_size"}) {
    m.Require(key);
  }
  if (given == 0) m.Require("num_experts");
  ELDR_RETURN_IF_ERROR(m.Finish());
  ELDR_RETURN_IF_ERROR(ValidateModelConfig(c, path));
  return c;
}

}  // namespace eldr
