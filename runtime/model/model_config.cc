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
  Status error;
  auto get_int = [&](const char* key, int* v, bool required) {
    if (!error.ok()) return;
    const YAML::Node n = y[key];
    if (!n) {
      if (required) error = Status::InvalidArgument(path + ": missing field '" + key + "'");
      return;
    }
    try {
      *v = n.as<int>();
    } catch (const YAML::Exception&) {
      error = YamlError(path, n, std::string("field '") + key + "' must be an integer");
    }
  };
  auto get_double = [&](const char* key, double* v) {
    if (!error.ok() || !y[key]) return;
    try {
      *v = y[key].as<double>();
    } catch (const YAML::Exception&) {
      error = Status::InvalidArgument(path + ": field '" + key + "' must be a number");
    }
  };
  c.name = y["name"] ? y["name"].as<std::string>("") : std::filesystem::path(path).stem().string();
  if (y["model_type"] && c.name.empty()) c.name = y["model_type"].as<std::string>("");
  get_int("hidden_size", &c.hidden_size, true);
  get_int("num_hidden_layers", &c.num_hidden_layers, true);
  get_int("num_attention_heads", &c.num_attention_heads, true);
  get_int("num_key_value_heads", &c.num_key_value_heads, false);
  if (c.num_key_value_heads == 0) c.num_key_value_heads = c.num_attention_heads;
  get_int("head_dim", &c.head_dim, false);
  if (c.head_dim == 0 && c.num_attention_heads > 0) c.head_dim = c.hidden_size / c.num_attention_heads;
  get_int("intermediate_size", &c.intermediate_size, false);
  get_int("moe_intermediate_size", &c.moe_intermediate_size, true);
  get_int("num_experts", &c.num_experts, false);
  if (c.num_experts == 0) get_int("n_routed_experts", &c.num_experts, false);
  if (c.num_experts == 0) get_int("num_local_experts", &c.num_experts, true);
  get_int("num_experts_per_tok", &c.num_experts_per_tok, true);
  get_int("vocab_size", &c.vocab_size, true);
  get_int("first_k_dense_replace", &c.first_k_dense_replace, false);
  get_int("n_shared_experts", &c.n_shared_experts, false);
  get_double("rope_theta", &c.rope_theta);
  get_double("rms_norm_eps", &c.rms_norm_eps);
  if (y["norm_topk_prob"]) c.norm_topk_prob = y["norm_topk_prob"].as<bool>(true);
  if (y["torch_dtype"]) c.torch_dtype = y["torch_dtype"].as<std::string>("float32");
  ELDR_RETURN_IF_ERROR(error);
  ELDR_RETURN_IF_ERROR(ValidateModelConfig(c, path));
  return c;
}

}  // namespace eldr
