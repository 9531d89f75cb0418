#include "runtime/model/weights.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "runtime/common/atomic_file.h"
#include "runtime/common/json_util.h"
#include "runtime/common/memory_budget.h"

namespace eldr {

namespace {

using kernels::DType;
using kernels::WeightMatrix;

// One tensor the model needs: its Hugging Face name, shape, and where it goes.
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  WeightMatrix* matrix = nullptr;        // for matrices
  std::vector<float>* vector = nullptr;  // for norms (fp32 copies)
};

std::vector<TensorSpec> Specs(const ModelConfig& c, ModelWeights* w) {
  const int64_t H = c.hidden_size, D = c.head_dim, I = c.moe_intermediate_size;
  std::vector<TensorSpec> s;
  w->layers.resize(c.num_hidden_layers);
  s.push_back({"model.embed_tokens.weight", {c.vocab_size, H}, &w->embed_tokens, nullptr});
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    LayerWeights& L = w->layers[l];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    s.push_back({p + "input_layernorm.weight", {H}, nullptr, &L.input_layernorm});
    s.push_back({p + "self_attn.q_proj.weight", {c.num_attention_heads * D, H}, &L.q_proj, nullptr});
    s.push_back({p + "self_attn.k_proj.weight", {c.num_key_value_heads * D, H}, &L.k_proj, nullptr});
    s.push_back({p + "self_attn.v_proj.weight", {c.num_key_value_heads * D, H}, &L.v_proj, nullptr});
    s.push_back({p + "self_attn.o_proj.weight", {H, c.num_attention_heads * D}, &L.o_proj, nullptr});
    s.push_back({p + "post_attention_layernorm.weight", {H}, nullptr, &L.post_attention_layernorm});
    if (c.is_moe_layer(l)) {
      s.push_back({p + "mlp.gate.weight", {c.num_experts, H}, &L.router, nullptr});
      L.experts.num_experts = c.num_experts;
      L.experts.hidden = static_cast<int>(H);
      L.experts.intermediate = static_cast<int>(I);
      L.experts.gate_proj.resize(c.num_experts);
      L.experts.up_proj.resize(c.num_experts);
      L.experts.down_proj.resize(c.num_experts);
      for (int e = 0; e < c.num_experts; ++e) {
        const std::string q = p + "mlp.experts." + std::to_string(e) + ".";
        s.push_back({q + "gate_proj.weight", {I, H}, &L.experts.gate_proj[e], nullptr});
        s.push_back({q + "up_proj.weight", {I, H}, &L.experts.up_proj[e], nullptr});
        s.push_back({q + "down_proj.weight", {H, I}, &L.experts.down_proj[e], nullptr});
      }
      if (c.n_shared_experts > 0) {
        const int64_t S = c.n_shared_experts * I;
        s.push_back({p + "mlp.shared_experts.gate_proj.weight", {S, H}, &L.shared_gate, nullptr});
        s.push_back({p + "mlp.shared_experts.up_proj.weight", {S, H}, &L.shared_up, nullptr});
        s.push_back({p + "mlp.shared_experts.down_proj.weight", {H, S}, &L.shared_down, nullptr});
      }
    } else {
      const int64_t F = c.intermediate_size;
      s.push_back({p + "mlp.gate_proj.weight", {F, H}, &L.mlp_gate, nullptr});
      s.push_back({p + "mlp.up_proj.weight", {F, H}, &L.mlp_up, nullptr});
      s.push_back({p + "mlp.down_proj.weight", {H, F}, &L.mlp_down, nullptr});
    }
  }
  s.push_back({"model.norm.weight", {H}, nullptr, &w->norm});
  s.push_back({"lm_head.weight", {c.vocab_size, H}, &w->lm_head, nullptr});
  return s;
}

int64_t Elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Fills `out` (n elements of `dtype`) with N(0, std²) values.
void FillNormal(void* out, int64_t n, DType dtype, double std, std::mt19937_64& rng) {
  std::normal_distribution<float> g(0.f, static_cast<float>(std));
  if (dtype == DType::kF32) {
    float* f = static_cast<float*>(out);
    for (int64_t i = 0; i < n; ++i) f[i] = g(rng);
  } else {
    uint16_t* b = static_cast<uint16_t*>(out);
    for (int64_t i = 0; i < n; ++i) b[i] = kernels::FloatToBf16(g(rng));
  }
}

void SetValue(void* base, int64_t i, DType dtype, float v) {
  if (dtype == DType::kF32) {
    static_cast<float*>(base)[i] = v;
  } else {
    static_cast<uint16_t*>(base)[i] = kernels::FloatToBf16(v);
  }
}

float GetValue(const void* base, int64_t i, DType dtype) {
  return dtype == DType::kF32 ? static_cast<const float*>(base)[i]
                              : kernels::Bf16ToFloat(static_cast<const uint16_t*>(base)[i]);
}

struct MappedFile {
  void* addr = MAP_FAILED;
  size_t size = 0;
  ~MappedFile() {
    if (addr != MAP_FAILED) munmap(addr, size);
  }
};

}  // namespace

double SyntheticWeightBytes(const ModelConfig& c) {
  // In closed form (doubles), not through Specs: a model config's sizes may be far past memory, and Specs builds
  // one entry per expert matrix.
  const double H = c.hidden_size, D = c.head_dim, I = c.moe_intermediate_size, V = c.vocab_size;
  const double moe_layers = c.num_moe_layers(), dense_layers = c.num_hidden_layers - moe_layers;
  const double attention = (2.0 * c.num_attention_heads + 2.0 * c.num_key_value_heads) * D * H;
  const double moe = c.num_experts * H + (3.0 * c.num_experts + 3.0 * c.n_shared_experts) * I * H;
  const double matrices =
      2 * V * H + c.num_hidden_layers * attention + moe_layers * moe + dense_layers * 3.0 * c.intermediate_size * H;
  const double norms = (2.0 * c.num_hidden_layers + 1) * H;
  const double dtype_bytes = kernels::DTypeBytes(c.torch_dtype == "bfloat16" ? DType::kBF16 : DType::kF32);
  return matrices * dtype_bytes + norms * sizeof(float);
}

int SyntheticTokenDomain(const ModelConfig& config, int num_domains, int32_t token) {
  return static_cast<int>(static_cast<int64_t>(token) * num_domains / config.vocab_size);
}

Result<ModelWeights> MakeSyntheticWeights(const ModelConfig& config, const SyntheticWeightOptions& o) {
  ELDR_RETURN_IF_ERROR(ValidateModelConfig(config, config.name));
  if (o.num_domains < 1 || o.num_domains > config.vocab_size) {
    return Status::InvalidArgument("synthetic weights: num_domains must be in [1, vocab_size]");
  }
  ELDR_RETURN_IF_ERROR(
      CheckMemoryBudget(SyntheticWeightBytes(config), config.name + ": the synthetic weights of this model config"));
  ModelWeights w;
  w.config = config;
  const DType dtype = config.torch_dtype == "bfloat16" ? DType::kBF16 : DType::kF32;
  std::vector<TensorSpec> specs = Specs(config, &w);
  int64_t total = 0;
  for (const auto& s : specs) {
    if (s.matrix) total += Elements(s.shape) * kernels::DTypeBytes(dtype);
  }
  auto buffer = std::shared_ptr<uint8_t[]>(new uint8_t[total]);
  w.storage = buffer;
  w.storage_bytes = total;
  std::mt19937_64 rng(o.seed);
  const int H = config.hidden_size;
  // Domain directions u_d: random unit vectors in the hidden space.
  std::vector<std::vector<float>> u(o.num_domains, std::vector<float>(H));
  std::normal_distribution<float> g(0.f, 1.f);
  for (auto& v : u) {
    double n2 = 0;
    for (auto& x : v) {
      x = g(rng);
      n2 += static_cast<double>(x) * x;
    }
    for (auto& x : v) x /= static_cast<float>(std::sqrt(n2 / H));  // RMS 1
  }
  const double residual_damp = 1.0 / std::sqrt(2.0 * config.num_hidden_layers);
  int64_t offset = 0;
  for (auto& s : specs) {
    if (s.vector) {
      s.vector->assign(Elements(s.shape), 1.f);
      continue;
    }
    WeightMatrix& m = *s.matrix;
    m.dtype = dtype;
    m.rows = s.shape[0];
    m.cols = s.shape[1];
    void* data = buffer.get() + offset;
    m.data = data;
    offset += m.rows * m.cols * kernels::DTypeBytes(dtype);
    const bool output = s.name.find("o_proj") != std::string::npos || s.name.find("down_proj") != std::string::npos;
    double std = 1.0 / std::sqrt(static_cast<double>(m.cols));
    if (output) std *= residual_damp;
    FillNormal(data, m.rows * m.cols, dtype, std, rng);
    if (s.name == "model.embed_tokens.weight") {
      // Token t of domain d: 0.8·u_d + 0.6·noise (RMS about 1).
      for (int64_t t = 0; t < m.rows; ++t) {
        const auto& dir = u[SyntheticTokenDomain(config, o.num_domains, static_cast<int32_t>(t))];
        for (int64_t h = 0; h < m.cols; ++h) {
          const float noise = GetValue(data, t * m.cols + h, dtype) * std::sqrt(static_cast<float>(m.cols));
          SetValue(data, t * m.cols + h, dtype, 0.8f * dir[h] + 0.6f * noise);
        }
      }
    } else if (s.name.find("mlp.gate.weight") != std::string::npos) {
      // Router row e leans towards its home domain e mod D.
      for (int64_t e = 0; e < m.rows; ++e) {
        const auto& dir = u[e % o.num_domains];
        for (int64_t h = 0; h < m.cols; ++h) {
          const float base = GetValue(data, e * m.cols + h, dtype);
          SetValue(data, e * m.cols + h, dtype, base + static_cast<float>(o.domain_strength / m.cols) * dir[h]);
        }
      }
    }
  }
  return w;
}

Result<ModelWeights> LoadSafetensors(const ModelConfig& config, const std::string& path) {
  ELDR_RETURN_IF_ERROR(ValidateModelConfig(config, config.name));
  ELDR_RETURN_IF_ERROR(CheckInputFile(path, "a .safetensors file"));
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return Status::NotFound(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::InvalidArgument(path + ": is not a regular file (expected a .safetensors file)");
  }
  auto map = std::make_shared<MappedFile>();
  map->size = static_cast<size_t>(st.st_size);
  if (map->size < 8) {
    ::close(fd);
    return Status::Corrupt(path + ": too short for a safetensors file");
  }
  map->addr = ::mmap(nullptr, map->size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map->addr == MAP_FAILED) return Status::IoError(path + ": mmap failed: " + std::strerror(errno));
  const uint8_t* base = static_cast<const uint8_t*>(map->addr);
  uint64_t header_len = 0;
  std::memcpy(&header_len, base, 8);  // little-endian u64
  if (header_len > map->size - 8) return Status::Corrupt(path + ": header length exceeds the file (truncated?)");
  auto parsed = ParseJson(std::string(reinterpret_cast<const char*>(base + 8), header_len));
  if (!parsed.ok()) return Status::Corrupt(path + ": safetensors header: " + parsed.status().message());
  const nlohmann::json header = std::move(parsed).value();
  const uint8_t* data = base + 8 + header_len;
  const uint64_t data_size = map->size - 8 - header_len;
  ModelWeights w;
  w.config = config;
  w.storage = map;
  w.storage_bytes = static_cast<int64_t>(map->size);
  for (auto& s : Specs(config, &w)) {
    auto it = header.find(s.name);
    if (it == header.end()) return Status::InvalidArgument(path + ": missing tensor " + s.name);
    if (!it->is_object()) return Status::Corrupt(path + ": " + s.name + ": its header entry is not a JSON object");
    std::string dt;
    std::vector<int64_t> shape;
    std::vector<uint64_t> off;
    try {
      dt = it->value("dtype", "");
      shape = it->value("shape", std::vector<int64_t>{});
      off = it->value("data_offsets", std::vector<uint64_t>{});
    } catch (const nlohmann::json::exception&) {
      return Status::Corrupt(path + ": " + s.name + ": dtype, shape or data_offsets has the wrong JSON type");
    }
    DType dtype;
    if (dt == "F32") {
      dtype = DType::kF32;
    } else if (dt == "BF16") {
      dtype = DType::kBF16;
    } else {
      return Status::InvalidArgument(path + ": " + s.name + ": dtype " + dt + " is not supported (F32 or BF16)");
    }
    if (shape != s.shape) {
      return Status::InvalidArgument(path + ": " + s.name + ": shape " + ShapeString(shape) + ", expected " +
                                     ShapeString(s.shape));
    }
    const uint64_t bytes = static_cast<uint64_t>(Elements(shape)) * kernels::DTypeBytes(dtype);
    if (off.size() != 2 || off[1] < off[0] || off[1] - off[0] != bytes || off[1] > data_size) {
      return Status::Corrupt(path + ": " + s.name + ": data_offsets do not match its shape or the file size");
    }
    const void* ptr = data + off[0];
    if (s.vector) {
      s.vector->resize(Elements(shape));
      for (int64_t i = 0; i < Elements(shape); ++i) (*s.vector)[i] = GetValue(ptr, i, dtype);
    } else {
      *s.matrix = WeightMatrix{dtype, ptr, shape[0], shape[1]};
    }
  }
  return w;
}

Status WriteSafetensors(const ModelWeights& weights, const std::string& path) {
  // A copy of the views (cheap: matrices are views, storage is shared) that Specs() can point into.
  ModelWeights w = weights;
  std::vector<TensorSpec> real = Specs(w.config, &w);
  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = {{"format", "pt"}, {"producer", "eldr"}};
  uint64_t offset = 0;
  std::vector<std::pair<const void*, uint64_t>> chunks;
  for (const auto& s : real) {
    std::string dt;
    const void* ptr;
    uint64_t bytes;
    if (s.vector) {
      dt = "F32";
      bytes = s.vector->size() * 4;
      ptr = s.vector->data();
    } else {
      dt = s.matrix->dtype == DType::kF32 ? "F32" : "BF16";
      bytes = static_cast<uint64_t>(s.matrix->rows * s.matrix->cols) * kernels::DTypeBytes(s.matrix->dtype);
      ptr = s.matrix->data;
    }
    header[s.name] = {{"dtype", dt}, {"shape", s.shape}, {"data_offsets", {offset, offset + bytes}}};
    chunks.emplace_back(ptr, bytes);
    offset += bytes;
  }
  std::string h = header.dump();
  while ((h.size() + 8) % 8 != 0) h += ' ';  // align the data section to 8 bytes
  AtomicOutput out(path);
  ELDR_RETURN_IF_ERROR(out.CheckWritable());
  {
    std::ofstream f(out.temp_path(), std::ios::binary);
    const uint64_t n = h.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f.write(h.data(), static_cast<std::streamsize>(h.size()));
    for (const auto& [p, b] : chunks) f.write(static_cast<const char*>(p), static_cast<std::streamsize>(b));
    f.close();  // the close flushes: its failure is the write's
    if (!f) return Status::IoError(path + ": write failed (disk full?)");
  }
  return out.Commit();
}

}  // namespace eldr
