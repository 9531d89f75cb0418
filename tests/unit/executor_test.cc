// The executor on the tiny model: KV-cache consistency (decode = prefill), prefix hits, trace replay,
// signature rows from prefill, safetensors round trip and rejection of wrong tensors, model configs.
#include "runtime/model/executor.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "runtime/kvcache/block_manager.h"
#include "runtime/kvcache/prefill_signature.h"

namespace eldr {
namespace {

namespace fs = std::filesystem;

std::string Config(const std::string& name) { return std::string(ELDR_SOURCE_DIR) + "/configs/models/" + name; }

ModelWeights Tiny(const std::string& dtype = "float32", uint64_t seed = 1) {
  auto c = LoadModelConfig(Config("tiny.yaml"));
  EXPECT_TRUE(c.ok()) << c.status().message();
  ModelConfig cfg = c.value();
  cfg.torch_dtype = dtype;
  SyntheticWeightOptions o;
  o.seed = seed;
  return MakeSyntheticWeights(cfg, o).value();
}

std::vector<int32_t> Prompt(int n, uint64_t seed, int vocab) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

void ExpectClose(const std::vector<float>& a, const float* b, float tol) {
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], tol * (1 + std::abs(a[i]))) << i;
}

TEST(ModelConfig, ShippedConfigsLoad) {
  for (const char* f :
       {"tiny.yaml", "cpu-demo.yaml", "qwen3-30b-a3b.yaml", "deepseek-v2-lite.yaml", "gpt-oss-120b.yaml"}) {
    auto c = LoadModelConfig(Config(f));
    ASSERT_TRUE(c.ok()) << f << ": " << c.status().message();
  }
  auto q = LoadModelConfig(Config("qwen3-30b-a3b.yaml")).value();
  EXPECT_EQ(q.num_moe_layers(), 48);
  EXPECT_EQ(q.num_experts, 128);
  EXPECT_EQ(q.expert_bytes(), 3LL * 2048 * 768 * 2);
  auto d = LoadModelConfig(Config("deepseek-v2-lite.yaml")).value();
  EXPECT_EQ(d.num_moe_layers(), 26);  // the routing trace's 26 MoE layers
  EXPECT_EQ(d.num_experts, 64);
  EXPECT_EQ(d.num_experts_per_tok, 6);
  // About 15.7B parameters for DeepSeek-V2-Lite with MLA modelled as GQA (published: 15.7B).
  EXPECT_NEAR(d.num_parameters() / 1e9, 15.7, 1.5);
}

TEST(ModelConfig, BadConfigsNameTheField) {
  const fs::path p = fs::temp_directory_path() / ("eldr_cfg_" + std::to_string(::getpid()) + ".yaml");
  std::ofstream(p) << "hidden_size: 32\nnum_hidden_layers: 2\nnum_attention_heads: 4\nmoe_intermediate_size: 8\n"
                      "num_experts: 4\nnum_experts_per_tok: 9\nvocab_size: 10\n";
  auto c = LoadModelConfig(p.string());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("num_experts_per_tok"), std::string::npos);
  std::ofstream(p) << "hidden_size: [1, 2\n";
  EXPECT_NE(LoadModelConfig(p.string()).status().message().find("invalid YAML"), std::string::npos);
  std::ofstream(p) << "hidden_size: abc\n";
  EXPECT_NE(LoadModelConfig(p.string()).status().message().find(":1: hidden_size must be an integer in [1, "),
            std::string::npos);
  fs::remove(p);
  EXPECT_EQ(LoadModelConfig("/nonexistent.yaml").status().code(), StatusCode::kNotFound);
}

// The sizes the serving job checks against the memory budget before it allocates are what the allocations are.
TEST(Executor, MemoryEstimatesEqualWhatIsAllocated) {
  for (const std::string dtype : {"float32", "bfloat16"}) {
    const ModelWeights w = Tiny(dtype);
    const ModelConfig& c = w.config;
    // The parameter count by hand from the config (embedding and head, attention, dense or MoE MLP, norms).
    const double H = c.hidden_size, D = c.head_dim, I = c.moe_intermediate_size;
    double matrices = 2.0 * c.vocab_size * H;
    for (int l = 0; l < c.num_hidden_layers; ++l) {
      matrices += 2 * c.num_attention_heads * D * H + 2 * c.num_key_value_heads * D * H;
      matrices += c.is_moe_layer(l) ? c.num_experts * H + c.num_experts * 3 * I * H + 3 * c.n_shared_experts * I * H
                                    : 3.0 * c.intermediate_size * H;
    }
    const double norms = (2.0 * c.num_hidden_layers + 1) * H;
    const double dtype_bytes = dtype == "bfloat16" ? 2 : 4;
    EXPECT_EQ(static_cast<double>(w.storage_bytes), matrices * dtype_bytes) << dtype;
    EXPECT_EQ(SyntheticWeightBytes(c), matrices * dtype_bytes + norms * sizeof(float)) << dtype;
    for (const auto& [blocks, block_size] : {std::pair{7, 4}, std::pair{64, 16}}) {
      const Executor ex(w, blocks, block_size);
      EXPECT_EQ(Executor::KvBytes(w.config, blocks, block_size), static_cast<double>(ex.kv_bytes())) << dtype;
    }
  }
}

TEST(Executor, DecodeLogitsEqualPrefillLogits) {
  for (const char* dtype : {"float32", "bfloat16"}) {
    ModelWeights w = Tiny(dtype);
    const auto tokens = Prompt(21, 3, w.config.vocab_size);
    BlockManager bm(32, 4);
    // Full prefill of 21 tokens.
    Executor full(w, 32, 4);
    auto a = bm.AllocatePrompt(tokens).value();
    auto ref = full.Prefill(tokens, a.blocks, 0, nullptr, nullptr);
    ASSERT_TRUE(ref.ok()) << ref.status().message();
    // Prefill of 20 tokens, then one decode step with token 21.
    Executor inc(w, 32, 4);
    std::vector<int32_t> head(tokens.begin(), tokens.end() - 1);
    BlockManager bm2(32, 4);
    auto b = bm2.AllocatePrompt(head).value();
    ASSERT_TRUE(inc.Prefill(head, b.blocks, 0, nullptr, nullptr).ok());
    std::vector<BlockId> table = b.blocks;
    ASSERT_TRUE(bm2.AppendSlot(&table, 20).ok());
    DecodeSequence s{tokens.back(), 20, &table, nullptr};
    auto d = inc.Decode({s});
    ASSERT_TRUE(d.ok()) << d.status().message();
    ExpectClose(ref->last_logits, d->logits.data(), 1e-4f);
    EXPECT_EQ(ref->next_token, d->next_tokens[0]);
  }
}

TEST(Executor, BatchedDecodeEqualsSingleDecodes) {
  ModelWeights w = Tiny();
  Executor ex(w, 64, 4);
  BlockManager bm(64, 4);
  std::vector<std::vector<int32_t>> prompts = {Prompt(5, 1, 64), Prompt(13, 2, 64), Prompt(8, 3, 64)};
  std::vector<std::vector<BlockId>> tables;
  std::vector<int32_t> next;
  for (const auto& p : prompts) {
    auto a = bm.AllocatePrompt(p).value();
    auto r = ex.Prefill(p, a.blocks, 0, nullptr, nullptr).value();
    std::vector<BlockId> t = a.blocks;
    ASSERT_TRUE(bm.AppendSlot(&t, static_cast<int64_t>(p.size())).ok());
    tables.push_back(t);
    next.push_back(r.next_token);
  }
  std::vector<DecodeSequence> batch;
  for (size_t i = 0; i < prompts.size(); ++i) {
    batch.push_back({next[i], static_cast<int32_t>(prompts[i].size()), &tables[i], nullptr});
  }
  auto all = ex.Decode(batch).value();
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto one = ex.Decode({batch[i]}).value();  // rewrites the same KV slot with the same values
    std::vector<float> a(all.logits.begin() + i * 64, all.logits.begin() + (i + 1) * 64);
    ExpectClose(a, one.logits.data(), 1e-4f);
  }
  // Distinct experts per layer is the size of the union of the batch's top-k.
  const int Lm = w.config.num_moe_layers(), K = w.config.num_experts_per_tok;
  for (int l = 0; l < Lm; ++l) {
    std::set<int> u;
    for (size_t i = 0; i < prompts.size(); ++i) {
      for (int j = 0; j < K; ++j) u.insert(all.topk_ids[(i * Lm + l) * K + j]);
    }
    EXPECT_EQ(all.distinct_experts[l], static_cast<int>(u.size()));
  }
}

TEST(Executor, PrefixHitGivesTheSameLogitsAsColdPrefill) {
  ModelWeights w = Tiny();
  Executor ex(w, 64, 4);
  BlockManager bm(64, 4);
  auto p1 = Prompt(18, 5, 64);
  auto a = bm.AllocatePrompt(p1).value();
  auto cold = ex.Prefill(p1, a.blocks, 0, nullptr, nullptr).value();
  // Same 16-token prefix, different tail: the first 4 blocks hit.
  auto p2 = p1;
  p2[17] = (p2[17] + 1) % 64;
  auto b = bm.AllocatePrompt(p2).value();
  EXPECT_EQ(b.num_cached_blocks, 4);
  auto hit = ex.Prefill(p2, b.blocks, b.num_cached_blocks * 4, nullptr, nullptr).value();
  Executor fresh(w, 64, 4);
  BlockManager bm2(64, 4);
  auto c = bm2.AllocatePrompt(p2).value();
  auto ref = fresh.Prefill(p2, c.blocks, 0, nullptr, nullptr).value();
  ExpectClose(ref.last_logits, hit.last_logits.data(), 1e-4f);
  (void)cold;
}

TEST(Executor, TraceReplayReproducesTheTraceExpertIds) {
  ModelWeights w = Tiny();
  const int Lm = w.config.num_moe_layers(), K = w.config.num_experts_per_tok, E = w.config.num_experts;
  const int n = 9;
  std::mt19937_64 rng(11);
  std::vector<uint16_t> ids(n * Lm * K);
  for (int i = 0; i < n * Lm; ++i) {
    ids[i * K] = static_cast<uint16_t>(rng() % E);
    ids[i * K + 1] = static_cast<uint16_t>((ids[i * K] + 1 + rng() % (E - 1)) % E);
  }
  Executor ex(w, 16, 4);
  BlockManager bm(16, 4);
  auto tokens = Prompt(n, 4, 64);
  auto a = bm.AllocatePrompt(tokens).value();
  GateReplay replay{ids.data(), nullptr};
  auto r = ex.Prefill(tokens, a.blocks, 0, &replay, nullptr).value();
  EXPECT_EQ(r.topk_ids, ids);
  // Decode with one token of replayed routing.
  std::vector<BlockId> table = a.blocks;
  ASSERT_TRUE(bm.AppendSlot(&table, n).ok());
  std::vector<uint16_t> one(ids.begin(), ids.begin() + Lm * K);
  GateReplay r1{one.data(), nullptr};
  auto d = ex.Decode({{r.next_token, n, &table, &r1}}).value();
  EXPECT_EQ(d.topk_ids, one);
  // Computed routing differs from the random replay somewhere (the replay really overrides).
  auto computed = ex.Prefill(tokens, a.blocks, 0, nullptr, nullptr).value();
  EXPECT_NE(computed.topk_ids, ids);
}

TEST(Executor, PrefillWritesSignatureRowsEqualToTheRoutingCounts) {
  ModelWeights w = Tiny();
  const int Lm = w.config.num_moe_layers(), K = w.config.num_experts_per_tok, E = w.config.num_experts;
  Executor ex(w, 32, 4);
  BlockManager bm(32, 4);
  SignatureCache sc(32, Lm, E, 4);
  AttachSignatureCache(bm, sc);
  auto tokens = Prompt(14, 6, 64);
  auto a = bm.AllocatePrompt(tokens).value();
  auto r = ex.Prefill(tokens, a.blocks, 0, nullptr, &sc).value();
  std::vector<float> counts(Lm * E);
  sc.SumCounts(a.blocks, nullptr, counts.data());
  std::vector<float> expect(Lm * E, 0.f);
  for (int t = 0; t < 14; ++t) {
    for (int l = 0; l < Lm; ++l) {
      for (int j = 0; j < K; ++j) expect[l * E + r.topk_ids[(t * Lm + l) * K + j]] += 1;
    }
  }
  EXPECT_EQ(counts, expect);
  // Block by block too.
  for (size_t b = 0; b < a.blocks.size(); ++b) {
    for (int l = 0; l < Lm; ++l) {
      for (int e = 0; e < E; ++e) {
        int c = 0;
        for (int t = static_cast<int>(b) * 4; t < std::min(14, static_cast<int>(b + 1) * 4); ++t) {
          for (int j = 0; j < K; ++j) c += r.topk_ids[(t * Lm + l) * K + j] == e;
        }
        EXPECT_EQ(sc.Count(a.blocks[b], l * E + e), c);
      }
    }
  }
}

TEST(Executor, SyntheticDomainsPreferDifferentExperts) {
  auto c = LoadModelConfig(Config("tiny.yaml")).value();
  SyntheticWeightOptions o;
  o.num_domains = 4;
  o.domain_strength = 8.0;
  ModelWeights w = MakeSyntheticWeights(c, o).value();
  Executor ex(w, 64, 16);
  BlockManager bm(64, 16);
  const int Lm = c.num_moe_layers(), K = c.num_experts_per_tok, E = c.num_experts;
  // Histogram of experts at the first MoE layer per domain.
  std::vector<std::vector<double>> hist(4, std::vector<double>(E, 0));
  for (int d = 0; d < 4; ++d) {
    std::vector<int32_t> tokens(48);
    std::mt19937_64 rng(d);
    for (auto& t : tokens) t = d * 16 + static_cast<int32_t>(rng() % 16);  // domain d's token range
    auto a = bm.AllocatePrompt(tokens).value();
    auto r = ex.Prefill(tokens, a.blocks, 0, nullptr, nullptr).value();
    bm.Free(a.blocks);
    for (int t = 0; t < 48; ++t) {
      for (int j = 0; j < K; ++j) hist[d][r.topk_ids[(t * Lm) * K + j]] += 1;
    }
  }
  // Home experts (e mod 4 == d) get most of each domain's selections.
  for (int d = 0; d < 4; ++d) {
    double home = 0, total = 0;
    for (int e = 0; e < E; ++e) {
      total += hist[d][e];
      if (e % 4 == d) home += hist[d][e];
    }
    EXPECT_GT(home / total, 0.5) << "domain " << d;
  }
}

TEST(Safetensors, RoundTripAndRejection) {
  const fs::path dir = fs::temp_directory_path() / ("eldr_st_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  ModelWeights w = Tiny("bfloat16");
  const std::string path = (dir / "model.safetensors").string();
  ASSERT_TRUE(WriteSafetensors(w, path).ok());
  auto loaded = LoadSafetensors(w.config, path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  // Same logits from the loaded weights.
  auto tokens = Prompt(7, 9, 64);
  BlockManager bm(8, 4);
  auto a = bm.AllocatePrompt(tokens).value();
  Executor e1(w, 8, 4), e2(loaded.value(), 8, 4);
  auto r1 = e1.Prefill(tokens, a.blocks, 0, nullptr, nullptr).value();
  auto r2 = e2.Prefill(tokens, a.blocks, 0, nullptr, nullptr).value();
  EXPECT_EQ(r1.last_logits, r2.last_logits);
  // A file whose header gives one tensor the wrong shape: rejected with that tensor's name.
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  auto header = nlohmann::json::parse(bytes.substr(8, n));
  const std::string victim = "model.layers.2.mlp.experts.5.up_proj.weight";
  header[victim]["shape"] = {8, 64};  // same byte count, wrong shape
  std::string h = header.dump();
  while (h.size() < n) h += ' ';
  ASSERT_EQ(h.size(), n);
  std::string bad = bytes.substr(0, 8) + h + bytes.substr(8 + n);
  const std::string bad_path = (dir / "bad.safetensors").string();
  std::ofstream(bad_path, std::ios::binary) << bad;
  auto r = LoadSafetensors(w.config, bad_path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(victim + ": shape [8, 64], expected [16, 32]"), std::string::npos)
      << r.status().message();
  // A missing tensor.
  header = nlohmann::json::parse(bytes.substr(8, n));
  header["lm_head.weightX"] = header["lm_head.weight"];
  header.erase("lm_head.weight");
  h = header.dump();
  while (h.size() < n) h += ' ';
  if (h.size() == n) {
    std::ofstream(bad_path, std::ios::binary) << bytes.substr(0, 8) + h + bytes.substr(8 + n);
    EXPECT_NE(LoadSafetensors(w.config, bad_path).status().message().find("missing tensor lm_head.weight"),
              std::string::npos);
  }
  // Truncated file.
  std::ofstream(bad_path, std::ios::binary) << bytes.substr(0, 100);
  EXPECT_FALSE(LoadSafetensors(w.config, bad_path).ok());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace eldr
