// The executor written against the compute-backend interface (kernels/backend.h): a recording backend that
// forwards to the CPU backend sees every operation of a prefill, a decode step and a KV transfer, with the
// same bits as the default executor; replayed routing goes through ReplayTopK; host weights on a backend
// without host memory are refused with one clear line.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "runtime/common/check.h"
#include "runtime/model/executor.h"

namespace eldr {
namespace {

using namespace kernels;  // NOLINT(google-build-using-namespace): the interface's names

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Forwards to the CPU backend and counts the operations; host_memory as told.
class RecordingBackend : public Backend {
 public:
  explicit RecordingBackend(bool host_memory = true) : host_memory_(host_memory) {}
  const char* name() const override { return "recording"; }
  bool host_memory() const override { return host_memory_; }
  std::unique_ptr<Buffer> Alloc(DType t, int64_t n) override { return cpu_.Alloc(t, n); }
  void CopyHostToDevice(void* d, const void* h, size_t n, Stream& s) override { cpu_.CopyHostToDevice(d, h, n, s); }
  void CopyDeviceToHost(void* h, const void* d, size_t n, Stream& s) override { cpu_.CopyDeviceToHost(h, d, n, s); }
  void CopyDeviceToDevice(void* d, const void* x, size_t n, Stream& s) override { cpu_.CopyDeviceToDevice(d, x, n, s); }
  void MemsetZero(void* d, size_t n, Stream& s) override { cpu_.MemsetZero(d, n, s); }
  std::unique_ptr<Stream> CreateStream() override { return cpu_.CreateStream(); }
  std::unique_ptr<Event> CreateEvent() override { return cpu_.CreateEvent(); }
  void RecordEvent(Event& e, Stream& s) override { cpu_.RecordEvent(e, s); }
  void StreamWaitEvent(Stream& s, Event& e) override { cpu_.StreamWaitEvent(s, e); }
  void SynchronizeEvent(Event& e) override { cpu_.SynchronizeEvent(e); }
  void SynchronizeStream(Stream& s) override { cpu_.SynchronizeStream(s); }
#define ELDR_RECORD(Op, Params)                  \
  void Op(const Params& p, Stream& s) override { \
    ++calls[#Op];                                \
    cpu_.Op(p, s);                               \
  }
  ELDR_RECORD(EmbeddingGather, EmbeddingGatherParams)
  ELDR_RECORD(RmsNorm, RmsNormParams)
  ELDR_RECORD(Linear, LinearParams)
  ELDR_RECORD(ApplyRope, RopeParams)
  ELDR_RECORD(WriteKvSlots, KvSlotWriteParams)
  ELDR_RECORD(PrefillAttention, PrefillAttentionParams)
  ELDR_RECORD(PagedAttentionDecode, PagedAttentionDecodeParams)
  ELDR_RECORD(ResidualAdd, ResidualAddParams)
  ELDR_RECORD(Mlp, MlpParams)
  ELDR_RECORD(GateTopK, GateTopKParams)
  ELDR_RECORD(ReplayTopK, ReplayTopKParams)
  ELDR_RECORD(MoeExperts, MoeParams)
  ELDR_RECORD(ExpertFfn, ExpertFfnParams)
  ELDR_RECORD(MoeCombine, MoeCombineParams)
  ELDR_RECORD(ArgMax, ArgMaxParams)
  ELDR_RECORD(PackKv, KvPackParams)
  ELDR_RECORD(UnpackKv, KvPackParams)
#undef ELDR_RECORD
  std::map<std::string, int> calls;

 private:
  bool host_memory_;
  Backend& cpu_ = CpuBackend();
};

ModelWeights TinyWeights() {
  auto c = LoadModelConfig(std::string(ELDR_SOURCE_DIR) + "/configs/models/tiny.yaml");
  EXPECT_TRUE(c.ok()) << c.status().message();
  return MakeSyntheticWeights(c.value(), SyntheticWeightOptions{}).value();
}

// Every operation of a prefill, a decode step and a KV transfer goes through the backend it is given, with
// the same tokens, logits and KV as the default (the process's CPU backend).
TEST(ExecutorOnBackend, RunsEveryOperationThroughTheInterface) {
  const ModelWeights w = TinyWeights();
  const ModelConfig& c = w.config;
  RecordingBackend rec;
  Executor plain(w, 16, 4), recorded(w, 16, 4, &rec);
  const std::vector<int32_t> prompt = {1, 5, 9, 2, 7, 3};
  const std::vector<BlockId> table = {2, 5};
  auto pa = plain.Prefill(prompt, table, 0, nullptr, nullptr);
  auto pb = recorded.Prefill(prompt, table, 0, nullptr, nullptr);
  ASSERT_TRUE(pa.ok() && pb.ok());
  EXPECT_TRUE(BitEqual(pa.value().last_logits, pb.value().last_logits));
  EXPECT_EQ(pa.value().next_token, pb.value().next_token);
  const DecodeSequence seq{pa.value().next_token, static_cast<int32_t>(prompt.size()), &table, nullptr};
  auto da = plain.Decode({seq});
  auto db = recorded.Decode({seq});
  ASSERT_TRUE(da.ok() && db.ok());
  EXPECT_TRUE(BitEqual(da.value().logits, db.value().logits));
  EXPECT_EQ(da.value().topk_ids, db.value().topk_ids);
  std::vector<float> kv_a(plain.KvFloatsPerToken() * 7), kv_b(kv_a.size());
  plain.ExportKv(table, 7, kv_a.data());
  recorded.ExportKv(table, 7, kv_b.data());
  EXPECT_TRUE(BitEqual(kv_a, kv_b));
  recorded.ImportKv({9, 11}, 7, kv_b.data());

  const int L = c.num_hidden_layers, Lm = c.num_moe_layers();
  EXPECT_EQ(rec.calls["EmbeddingGather"], 2);
  EXPECT_EQ(rec.calls["PrefillAttention"], L);
  EXPECT_EQ(rec.calls["PagedAttentionDecode"], L);
  EXPECT_EQ(rec.calls["WriteKvSlots"], 2 * L);
  EXPECT_EQ(rec.calls["ApplyRope"], 2 * L);
  EXPECT_EQ(rec.calls["ResidualAdd"], 2 * L);
  EXPECT_EQ(rec.calls["RmsNorm"], 2 * (2 * L + 1));
  EXPECT_EQ(rec.calls["Linear"], 2 * (4 * L + Lm + 1));
  EXPECT_EQ(rec.calls["GateTopK"], 2 * Lm);
  EXPECT_EQ(rec.calls["MoeExperts"], 2 * Lm);
  EXPECT_EQ(rec.calls["ArgMax"], 2);
  EXPECT_EQ(rec.calls["PackKv"], L);
  EXPECT_EQ(rec.calls["UnpackKv"], L);
  EXPECT_EQ(rec.calls["ReplayTopK"], 0);  // nothing replayed
}

TEST(ExecutorOnBackend, ReplayedRoutingGoesThroughReplayTopK) {
  const ModelWeights w = TinyWeights();
  const ModelConfig& c = w.config;
  RecordingBackend rec;
  Executor ex(w, 16, 4, &rec);
  const std::vector<int32_t> prompt = {4, 8, 15};
  const int Lm = c.num_moe_layers(), K = c.num_experts_per_tok;
  std::vector<uint16_t> ids(prompt.size() * Lm * K);  // [T, L_moe, K], distinct per token and layer
  for (size_t tl = 0; tl < prompt.size() * Lm; ++tl) {
    for (int j = 0; j < K; ++j) ids[tl * K + j] = static_cast<uint16_t>((tl + j) % c.num_experts);
  }
  const GateReplay replay{ids.data(), nullptr};
  auto r = ex.Prefill(prompt, {0}, 0, &replay, nullptr);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::vector<uint16_t> got(r.value().topk_ids.begin(), r.value().topk_ids.end());
  EXPECT_EQ(got, ids);
  EXPECT_EQ(rec.calls["ReplayTopK"], Lm);
}

TEST(ExecutorOnBackend, RefusesABackendWithoutHostMemoryForHostWeights) {
  const ModelWeights w = TinyWeights();
  RecordingBackend device_like(/*host_memory=*/false);
  try {
    Executor ex(w, 4, 4, &device_like);
    FAIL() << "the executor accepted host weights on a device backend";
  } catch (const eldr::Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs device weights"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace eldr
