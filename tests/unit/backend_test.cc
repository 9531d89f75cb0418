// The compute-backend interface (kernels/backend.h) on the CPU backend: the factory and its errors, buffers
// and copies, trivial streams and events, operations through the interface bit-identical to the direct
// kernel calls, and the operations the interface added checked against hand-computed cases.
#include "kernels/backend.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "runtime/common/check.h"

namespace eldr::kernels {
namespace {

std::vector<float> Random(size_t n, uint64_t seed, float scale = 1.f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = g(rng);
  return v;
}

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(BackendFactory, CpuAlwaysAndCudaAsBuilt) {
  auto cpu = CreateBackend("cpu");
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  EXPECT_STREQ(cpu.value()->name(), "cpu");
  EXPECT_TRUE(cpu.value()->host_memory());
  EXPECT_STREQ(CpuBackend().name(), "cpu");

  auto bad = CreateBackend("tpu");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("unknown compute backend 'tpu' (cpu or cuda)"), std::string::npos);

  auto cuda = CreateBackend("cuda");
  if (!CudaBackendCompiled()) {
    ASSERT_FALSE(cuda.ok());
    EXPECT_EQ(cuda.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(cuda.status().message().find("built without CUDA"), std::string::npos) << cuda.status().message();
  } else if (!CudaBackendStatus().ok()) {
    ASSERT_FALSE(cuda.ok());
    EXPECT_NE(cuda.status().message().find("no CUDA device"), std::string::npos) << cuda.status().message();
  } else {
    ASSERT_TRUE(cuda.ok()) << cuda.status().ToString();
    EXPECT_STREQ(cuda.value()->name(), "cuda");
    EXPECT_FALSE(cuda.value()->host_memory());
    EXPECT_FALSE(CreateBackend("cuda", 1 << 20).ok());
  }
}

TEST(BackendBuffers, SizesDtypesAndCopyRoundTrip) {
  Backend& b = CpuBackend();
  auto stream = b.CreateStream();
  const struct {
    DType dtype;
    size_t bytes;
  } kinds[] = {{DType::kF32, 4}, {DType::kBF16, 2}, {DType::kI32, 4}, {DType::kI64, 8}, {DType::kI8, 1}};
  for (const auto& k : kinds) {
    auto buf = b.Alloc(k.dtype, 37);
    EXPECT_EQ(buf->dtype(), k.dtype);
    EXPECT_EQ(buf->size(), 37);
    EXPECT_EQ(buf->bytes(), 37 * k.bytes) << DTypeName(k.dtype);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(buf->data()) % 64, 0u);
  }
  EXPECT_EQ(b.Alloc(DType::kF32, 0)->bytes(), 0u);

  const std::vector<float> host = Random(1001, 1);
  auto a = b.Alloc(DType::kF32, 1001), c = b.Alloc(DType::kF32, 1001);
  b.CopyHostToDevice(a->data(), host.data(), a->bytes(), *stream);
  b.CopyDeviceToDevice(c->data(), a->data(), a->bytes(), *stream);
  std::vector<float> back(1001, -1.f);
  b.CopyDeviceToHost(back.data(), c->data(), c->bytes(), *stream);
  // Synchronous: the copy is complete when the call returns; the events and waits are no-ops that succeed.
  EXPECT_TRUE(BitEqual(back, host));
  auto event = b.CreateEvent();
  b.RecordEvent(*event, *stream);
  b.StreamWaitEvent(*stream, *event);
  b.SynchronizeEvent(*event);
  b.SynchronizeStream(*stream);
  b.MemsetZero(c->data(), c->bytes(), *stream);
  b.CopyDeviceToHost(back.data(), c->data(), c->bytes(), *stream);
  EXPECT_EQ(back, std::vector<float>(1001, 0.f));

  EXPECT_NE(a->As<float>(), nullptr);
  try {
    (void)a->As<int32_t>();
    FAIL() << "As<int32_t> on an f32 buffer did not throw";
  } catch (const eldr::Error& e) {
    EXPECT_NE(std::string(e.what()).find("a buffer of f32 used as i32"), std::string::npos) << e.what();
  }
}

// The CPU backend forwards to the reference kernels: the same bits, through buffers of its own.
TEST(CpuBackendOps, EqualTheDirectKernelCallsBitForBit) {
  Backend& b = CpuBackend();
  auto s = b.CreateStream();
  const int T = 7, H = 48, E = 8, K = 2, I = 24;
  const auto x = Random(static_cast<size_t>(T) * H, 2), norm_w = Random(H, 3);
  std::vector<float> direct(x.size()), through(x.size());
  RmsNorm({x.data(), norm_w.data(), direct.data(), T, H, 1e-6f});
  auto dx = b.Alloc(DType::kF32, T * H), dn = b.Alloc(DType::kF32, H), dout = b.Alloc(DType::kF32, T * H);
  b.CopyHostToDevice(dx->data(), x.data(), dx->bytes(), *s);
  b.CopyHostToDevice(dn->data(), norm_w.data(), dn->bytes(), *s);
  b.RmsNorm({dx->As<float>(), dn->As<float>(), dout->As<float>(), T, H, 1e-6f}, *s);
  b.CopyDeviceToHost(through.data(), dout->data(), dout->bytes(), *s);
  EXPECT_TRUE(BitEqual(direct, through));

  const auto router = Random(static_cast<size_t>(E) * H, 4);
  const WeightMatrix rw{DType::kF32, router.data(), E, H};
  std::vector<float> logits_a(static_cast<size_t>(T) * E), logits_b(logits_a.size());
  Linear({x.data(), rw, logits_a.data(), T});
  b.Linear({x.data(), rw, logits_b.data(), T}, *s);
  EXPECT_TRUE(BitEqual(logits_a, logits_b));
  std::vector<int32_t> ids_a(T * K), ids_b(T * K);
  std::vector<float> w_a(T * K), w_b(T * K);
  GateTopK({logits_a.data(), T, E, K, true, ids_a.data(), w_a.data()});
  b.GateTopK({logits_b.data(), T, E, K, true, ids_b.data(), w_b.data()}, *s);
  EXPECT_EQ(ids_a, ids_b);
  EXPECT_TRUE(BitEqual(w_a, w_b));

  std::vector<std::vector<float>> g(E), u(E), d(E);
  ExpertWeights experts;
  experts.num_experts = E;
  experts.hidden = H;
  experts.intermediate = I;
  for (int e = 0; e < E; ++e) {
    g[e] = Random(static_cast<size_t>(I) * H, 10 + e, 0.2f);
    u[e] = Random(static_cast<size_t>(I) * H, 30 + e, 0.2f);
    d[e] = Random(static_cast<size_t>(H) * I, 50 + e, 0.2f);
    experts.gate_proj.push_back({DType::kF32, g[e].data(), I, H});
    experts.up_proj.push_back({DType::kF32, u[e].data(), I, H});
    experts.down_proj.push_back({DType::kF32, d[e].data(), H, I});
  }
  std::vector<float> moe_a(x.size(), 0.5f), moe_b(x.size(), 0.5f);
  MoeExperts({x.data(), ids_a.data(), w_a.data(), T, K, &experts, moe_a.data(), true});
  b.MoeExperts({x.data(), ids_b.data(), w_b.data(), T, K, &experts, moe_b.data(), true}, *s);
  EXPECT_TRUE(BitEqual(moe_a, moe_b));
  std::vector<float> mlp_a(x.size(), 0.f), mlp_b(x.size(), 0.f);
  Mlp({x.data(), experts.gate_proj[1], experts.up_proj[1], experts.down_proj[1], T, mlp_a.data()});
  b.Mlp({x.data(), experts.gate_proj[1], experts.up_proj[1], experts.down_proj[1], T, mlp_b.data()}, *s);
  EXPECT_TRUE(BitEqual(mlp_a, mlp_b));
}

TEST(CpuBackendOps, EmbeddingGatherResidualAddArgMaxByHand) {
  Backend& b = CpuBackend();
  auto s = b.CreateStream();
  // vocab 3, hidden 2; bf16 holds these values exactly.
  const std::vector<float> table = {1.f, 2.f, -3.f, 4.f, 0.5f, -0.25f};
  std::vector<uint16_t> table_bf16(table.size());
  for (size_t i = 0; i < table.size(); ++i) table_bf16[i] = FloatToBf16(table[i]);
  const std::vector<int32_t> tokens = {2, 0, 2};
  for (const WeightMatrix& m :
       {WeightMatrix{DType::kF32, table.data(), 3, 2}, WeightMatrix{DType::kBF16, table_bf16.data(), 3, 2}}) {
    std::vector<float> out(6, -9.f);
    b.EmbeddingGather({m, tokens.data(), 3, out.data()}, *s);
    EXPECT_EQ(out, (std::vector<float>{0.5f, -0.25f, 1.f, 2.f, 0.5f, -0.25f}));
  }
  const int32_t bad_token = 3;
  std::vector<float> out(2);
  EXPECT_THROW(b.EmbeddingGather({{DType::kF32, table.data(), 3, 2}, &bad_token, 1, out.data()}, *s), eldr::Error);

  std::vector<float> acc = {1.f, 2.f, 3.f};
  const std::vector<float> add = {0.5f, -2.f, 10.f};
  b.ResidualAdd({add.data(), acc.data(), 3}, *s);
  EXPECT_EQ(acc, (std::vector<float>{1.5f, 0.f, 13.f}));

  // Ties go to the first index; a NaN never wins over an earlier entry.
  const std::vector<float> rows = {0.f, 3.f, 3.f, 1.f, /**/ -1.f, -2.f, -0.5f, -0.5f, /**/ 2.f, NAN, 1.f, 0.f};
  std::vector<int32_t> best(3, -1);
  b.ArgMax({rows.data(), 3, 4, best.data()}, *s);
  EXPECT_EQ(best, (std::vector<int32_t>{1, 2, 0}));
}

TEST(CpuBackendOps, ReplayTopKByHand) {
  Backend& b = CpuBackend();
  auto s = b.CreateStream();
  // Token 0 keeps the gate's choice, token 1 replays ids {2, 0} with the router's probabilities
  // (softmax of log 1, log 2, log 3 = 1/6, 2/6, 3/6; renormalised over {2, 0}: 3/4, 1/4), token 2 replays
  // ids {1, 2} with the given weights.
  const int E = 3, K = 2;
  const std::vector<float> logits = {0.f, 0.f, 5.f, 0.f, std::log(2.f), std::log(3.f), 0.f, 0.f, 0.f};
  const std::vector<int8_t> mode = {kReplayKeep, kReplayIds, kReplayIdsAndWeights};
  const std::vector<int32_t> replay_ids = {0, 0, 2, 0, 1, 2};
  const std::vector<float> replay_w = {0.f, 0.f, 0.f, 0.f, 0.9f, 0.1f};
  std::vector<int32_t> ids = {2, 0, -1, -1, -1, -1};
  std::vector<float> w = {0.7f, 0.3f, 0.f, 0.f, 0.f, 0.f};
  for (bool renorm : {true, false}) {
    b.ReplayTopK(
        {logits.data(), mode.data(), replay_ids.data(), replay_w.data(), 3, E, K, renorm, ids.data(), w.data()}, *s);
    EXPECT_EQ(ids, (std::vector<int32_t>{2, 0, 2, 0, 1, 2}));
    EXPECT_EQ(w[0], 0.7f);
    EXPECT_EQ(w[1], 0.3f);
    EXPECT_NEAR(w[2], renorm ? 0.75 : 0.5, 1e-6);
    EXPECT_NEAR(w[3], renorm ? 0.25 : 1.0 / 6, 1e-6);
    EXPECT_EQ(w[4], 0.9f);
    EXPECT_EQ(w[5], 0.1f);
  }
}

// Slot-mapped KV write equals the block-table write; pack lays out [2, tokens, kv_heads, head_dim] (K then
// V) in slot order; unpack into another cache restores the rows; slots out of range throw.
TEST(CpuBackendOps, KvSlotWritePackAndUnpack) {
  Backend& b = CpuBackend();
  auto s = b.CreateStream();
  const int num_blocks = 5, bs = 4, Hk = 2, D = 3, row = Hk * D, n = 6;
  const size_t cache_floats = static_cast<size_t>(num_blocks) * bs * row;
  std::vector<float> k1(cache_floats, 0.f), v1(cache_floats, 0.f), k2(cache_floats, 0.f), v2(cache_floats, 0.f);
  const PagedKv by_table{k1.data(), v1.data(), num_blocks, bs, Hk, D};
  const PagedKv by_slot{k2.data(), v2.data(), num_blocks, bs, Hk, D};
  const std::vector<int32_t> table = {3, 1};  // positions 0..3 in block 3, 4..5 in block 1
  std::vector<int32_t> pos(n);
  std::vector<int64_t> slots(n);
  for (int t = 0; t < n; ++t) {
    pos[t] = t;
    slots[t] = static_cast<int64_t>(table[t / bs]) * bs + t % bs;
  }
  const auto k = Random(static_cast<size_t>(n) * row, 7), v = Random(static_cast<size_t>(n) * row, 8);
  WriteKv({by_table, table.data(), pos.data(), k.data(), v.data(), n});
  b.WriteKvSlots({by_slot, slots.data(), k.data(), v.data(), n}, *s);
  EXPECT_TRUE(BitEqual(k1, k2));
  EXPECT_TRUE(BitEqual(v1, v2));

  std::vector<float> packed(2 * static_cast<size_t>(n) * row, 0.f);
  b.PackKv({by_slot, slots.data(), n, packed.data()}, *s);
  EXPECT_TRUE(BitEqual(std::vector<float>(packed.begin(), packed.begin() + n * row), k));
  EXPECT_TRUE(BitEqual(std::vector<float>(packed.begin() + n * row, packed.end()), v));

  std::vector<float> k3(cache_floats, 0.f), v3(cache_floats, 0.f);
  const PagedKv other{k3.data(), v3.data(), num_blocks, bs, Hk, D};
  const std::vector<int64_t> other_slots = {0, 1, 2, 3, 17, 18};  // block 0, then block 4
  b.UnpackKv({other, other_slots.data(), n, packed.data()}, *s);
  for (int t = 0; t < n; ++t) {
    for (int i = 0; i < row; ++i) {
      ASSERT_EQ(k3[other_slots[t] * row + i], k[t * row + i]) << t;
      ASSERT_EQ(v3[other_slots[t] * row + i], v[t * row + i]) << t;
    }
  }
  const int64_t bad = num_blocks * bs;
  EXPECT_THROW(b.WriteKvSlots({by_slot, &bad, k.data(), v.data(), 1}, *s), eldr::Error);
  EXPECT_THROW(b.PackKv({by_slot, &bad, 1, packed.data()}, *s), eldr::Error);
  // The CPU kernels keep KV in f32; a bf16 cache is a device backend's and is refused here.
  PagedKv bf16 = by_slot;
  bf16.dtype = DType::kBF16;
  EXPECT_THROW(b.WriteKvSlots({bf16, slots.data(), k.data(), v.data(), n}, *s), eldr::Error);
}

}  // namespace
}  // namespace eldr::kernels
