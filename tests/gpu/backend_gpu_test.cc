// The compute-backend interface (kernels/backend.h) on both backends: every operation the CUDA backend
// implements, run through the interface on the CPU backend (the oracle) and on the CUDA backend on the same
// inputs, compared at the per-operation tolerances of tests/gpu/oracle.h; buffers, copies, streams and events
// on the device; and the operations not implemented yet fail loudly. Skipped without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/ops.h"
#include "runtime/common/check.h"
#include "tests/gpu/oracle.h"

namespace eldr::kernels {
namespace {

using namespace gpu_test;  // NOLINT(google-build-using-namespace): the oracle's helpers

class BackendGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!CudaBackendStatus().ok()) GTEST_SKIP() << CudaBackendStatus().message();
    auto made = CreateBackend("cuda", 0);
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    gpu_ = std::move(made).value();
    stream_ = gpu_->CreateStream();
    cpu_stream_ = cpu_.CreateStream();
  }

  // A device copy of host data.
  template <typename T>
  std::unique_ptr<Buffer> Up(const std::vector<T>& v) {
    auto b = gpu_->Alloc(DTypeOf<T>(), static_cast<int64_t>(v.size()));
    gpu_->CopyHostToDevice(b->data(), v.data(), v.size() * sizeof(T), *stream_);
    gpu_->SynchronizeStream(*stream_);  // v may be a temporary
    return b;
  }
  template <typename T>
  std::vector<T> Down(const Buffer& b) {
    std::vector<T> v(b.size());
    gpu_->CopyDeviceToHost(v.data(), b.data(), b.bytes(), *stream_);
    gpu_->SynchronizeStream(*stream_);
    return v;
  }

  Backend& cpu_ = CpuBackend();
  std::unique_ptr<Backend> gpu_;
  std::unique_ptr<Stream> stream_, cpu_stream_;
};

TEST_F(BackendGpu, BuffersCopiesStreamsAndEvents) {
  EXPECT_STREQ(gpu_->name(), "cuda");
  EXPECT_FALSE(gpu_->host_memory());
  std::vector<float> x(4099);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) * 0.5f - 7.f;
  auto a = Up(x);
  auto b = gpu_->Alloc(DType::kF32, static_cast<int64_t>(x.size()));
  EXPECT_EQ(b->bytes(), x.size() * 4);
  // A second stream copies a → b after an event recorded behind the upload.
  auto other = gpu_->CreateStream();
  auto uploaded = gpu_->CreateEvent();
  gpu_->RecordEvent(*uploaded, *stream_);
  gpu_->StreamWaitEvent(*other, *uploaded);
  gpu_->CopyDeviceToDevice(b->data(), a->data(), a->bytes(), *other);
  auto copied = gpu_->CreateEvent();
  gpu_->RecordEvent(*copied, *other);
  gpu_->SynchronizeEvent(*copied);
  EXPECT_EQ(Down<float>(*b), x);
  gpu_->MemsetZero(b->data(), b->bytes(), *stream_);
  EXPECT_EQ(Down<float>(*b), std::vector<float>(x.size(), 0.f));
}

TEST_F(BackendGpu, RmsNormAndRopeMatchTheCpuOracle) {
  std::mt19937_64 rng(21);
  const int T = 9, H = 2048, Hq = 8, Hk = 2, D = 128;
  auto x = Random(static_cast<size_t>(T) * H, rng, 2.f), w = Random(H, rng);
  std::vector<float> want(x.size());
  cpu_.RmsNorm({x.data(), w.data(), want.data(), T, H, 1e-6f}, *cpu_stream_);
  auto dx = Up(x), dw = Up(w), dout = gpu_->Alloc(DType::kF32, static_cast<int64_t>(x.size()));
  gpu_->RmsNorm({dx->As<float>(), dw->As<float>(), dout->As<float>(), T, H, 1e-6f}, *stream_);
  EXPECT_TRUE(Close(Down<float>(*dout), want, kTolRmsNorm));

  auto q = Random(static_cast<size_t>(T) * Hq * D, rng), k = Random(static_cast<size_t>(T) * Hk * D, rng);
  std::vector<int32_t> pos(T);
  for (int t = 0; t < T; ++t) pos[t] = t * 997;
  auto dq = Up(q), dk = Up(k), dpos = Up(pos);
  cpu_.ApplyRope({q.data(), k.data(), pos.data(), T, Hq, Hk, D, 1e6f}, *cpu_stream_);
  gpu_->ApplyRope({dq->As<float>(), dk->As<float>(), dpos->As<int32_t>(), T, Hq, Hk, D, 1e6f}, *stream_);
  EXPECT_TRUE(Close(Down<float>(*dq), q, kTolRope));
  EXPECT_TRUE(Close(Down<float>(*dk), k, kTolRope));
}

TEST_F(BackendGpu, LinearMatchesTheCpuOracle) {
  std::mt19937_64 rng(22);
  const int shapes[][3] = {{1, 2048, 128}, {16, 128, 2048}, {33, 100, 300}};
  for (const auto& s : shapes) {
    const int T = s[0], In = s[1], Out = s[2];
    const auto x = RoundToBf16(Random(static_cast<size_t>(T) * In, rng));
    const auto w = ToBf16(Random(static_cast<size_t>(Out) * In, rng, 1.f / std::sqrt(static_cast<float>(In))));
    std::vector<float> want(static_cast<size_t>(T) * Out);
    cpu_.Linear({x.data(), {DType::kBF16, w.data(), Out, In}, want.data(), T}, *cpu_stream_);
    auto dx = Up(x), dw = Up(w), dy = gpu_->Alloc(DType::kF32, static_cast<int64_t>(want.size()));
    gpu_->Linear({dx->As<float>(), {DType::kBF16, dw->data(), Out, In}, dy->As<float>(), T}, *stream_);
    EXPECT_TRUE(Close(Down<float>(*dy), want, kTolLinear)) << T << "x" << In << "->" << Out;
  }
}

TEST_F(BackendGpu, GateTopKMatchesTheCpuOracle) {
  std::mt19937_64 rng(23);
  const int T = 64, E = 128, K = 8;
  // Logits on a grid of 1/64 with distinct values per token, so no two are within fp32 noise: ids must agree
  // exactly.
  std::vector<float> logits(static_cast<size_t>(T) * E);
  std::vector<int32_t> perm(E);
  for (int t = 0; t < T; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int e = 0; e < E; ++e) logits[static_cast<size_t>(t) * E + e] = (perm[e] - E / 2) / 64.f;
  }
  for (bool renorm : {true, false}) {
    std::vector<int32_t> ids(static_cast<size_t>(T) * K);
    std::vector<float> w(ids.size());
    cpu_.GateTopK({logits.data(), T, E, K, renorm, ids.data(), w.data()}, *cpu_stream_);
    auto dl = Up(logits);
    auto dids = gpu_->Alloc(DType::kI32, static_cast<int64_t>(ids.size()));
    auto dwt = gpu_->Alloc(DType::kF32, static_cast<int64_t>(ids.size()));
    gpu_->GateTopK({dl->As<float>(), T, E, K, renorm, dids->As<int32_t>(), dwt->As<float>()}, *stream_);
    EXPECT_EQ(Down<int32_t>(*dids), ids) << (renorm ? "renormalised" : "");
    EXPECT_TRUE(Close(Down<float>(*dwt), w, kTolGateWeight)) << (renorm ? "renormalised" : "");
  }
}

TEST_F(BackendGpu, MoeExpertsMatchesTheCpuOracle) {
  std::mt19937_64 rng(24);
  const int T = 16, E = 16, K = 4, H = 256, I = 128;
  std::vector<std::vector<uint16_t>> gate(E), up(E), down(E);
  std::vector<std::unique_ptr<Buffer>> dev;
  ExpertWeights cw, gw;
  cw.num_experts = gw.num_experts = E;
  cw.hidden = gw.hidden = H;
  cw.intermediate = gw.intermediate = I;
  for (int e = 0; e < E; ++e) {
    gate[e] = ToBf16(Random(static_cast<size_t>(I) * H, rng, 1.f / 16));
    up[e] = ToBf16(Random(static_cast<size_t>(I) * H, rng, 1.f / 16));
    down[e] = ToBf16(Random(static_cast<size_t>(H) * I, rng, 1.f / 11));
    cw.gate_proj.push_back({DType::kBF16, gate[e].data(), I, H});
    cw.up_proj.push_back({DType::kBF16, up[e].data(), I, H});
    cw.down_proj.push_back({DType::kBF16, down[e].data(), H, I});
    for (auto* m : {&gate[e], &up[e], &down[e]}) dev.push_back(Up(*m));
    gw.gate_proj.push_back({DType::kBF16, dev[dev.size() - 3]->data(), I, H});
    gw.up_proj.push_back({DType::kBF16, dev[dev.size() - 2]->data(), I, H});
    gw.down_proj.push_back({DType::kBF16, dev[dev.size() - 1]->data(), H, I});
  }
  const auto x = RoundToBf16(Random(static_cast<size_t>(T) * H, rng));
  const auto ids = RandomTopK(T, E, K, rng);
  const auto w = RandomTopKWeights(T, K, rng);
  std::vector<float> want(x.size(), 0.f);
  cpu_.MoeExperts({x.data(), ids.data(), w.data(), T, K, &cw, want.data()}, *cpu_stream_);
  auto dx = Up(x), dids = Up(ids), dw = Up(w), dout = Up(std::vector<float>(x.size(), 0.f));
  gpu_->MoeExperts({dx->As<float>(), dids->As<int32_t>(), dw->As<float>(), T, K, &gw, dout->As<float>()}, *stream_);
  EXPECT_TRUE(Close(Down<float>(*dout), want, kTolMoe));
  // A second call reads the resident pointer table (uploaded once); the same result.
  gpu_->MemsetZero(dout->data(), dout->bytes(), *stream_);
  gpu_->MoeExperts({dx->As<float>(), dids->As<int32_t>(), dw->As<float>(), T, K, &gw, dout->As<float>()}, *stream_);
  EXPECT_TRUE(Close(Down<float>(*dout), want, kTolMoe));
  // The same descriptor with two experts swapped (as a new descriptor at a freed one's address would be): the
  // table is rebuilt, not reused stale.
  std::swap(cw.gate_proj[0], cw.gate_proj[1]);
  std::swap(cw.up_proj[0], cw.up_proj[1]);
  std::swap(cw.down_proj[0], cw.down_proj[1]);
  std::swap(gw.gate_proj[0], gw.gate_proj[1]);
  std::swap(gw.up_proj[0], gw.up_proj[1]);
  std::swap(gw.down_proj[0], gw.down_proj[1]);
  std::vector<float> want_swapped(x.size(), 0.f);
  cpu_.MoeExperts({x.data(), ids.data(), w.data(), T, K, &cw, want_swapped.data()}, *cpu_stream_);
  gpu_->MemsetZero(dout->data(), dout->bytes(), *stream_);
  gpu_->MoeExperts({dx->As<float>(), dids->As<int32_t>(), dw->As<float>(), T, K, &gw, dout->As<float>()}, *stream_);
  EXPECT_TRUE(Close(Down<float>(*dout), want_swapped, kTolMoe));
  EXPECT_FALSE(Close(want_swapped, want, kTolMoe));  // the swap changes the result (experts 0, 1 are routed to)
}

TEST_F(BackendGpu, MlpMatchesTheCpuOracle) {
  std::mt19937_64 rng(25);
  const int T = 5, H = 256, I = 512;
  const auto g = ToBf16(Random(static_cast<size_t>(I) * H, rng, 1.f / 16));
  const auto u = ToBf16(Random(static_cast<size_t>(I) * H, rng, 1.f / 16));
  const auto d = ToBf16(Random(static_cast<size_t>(H) * I, rng, 1.f / 22));
  const auto x = RoundToBf16(Random(static_cast<size_t>(T) * H, rng));
  std::vector<float> want(x.size(), 0.f);
  cpu_.Mlp({x.data(),
            {DType::kBF16, g.data(), I, H},
            {DType::kBF16, u.data(), I, H},
            {DType::kBF16, d.data(), H, I},
            T,
            want.data()},
           *cpu_stream_);
  auto dx = Up(x), dg = Up(g), du = Up(u), dd = Up(d), dout = Up(std::vector<float>(x.size(), 0.f));
  gpu_->Mlp({dx->As<float>(),
             {DType::kBF16, dg->data(), I, H},
             {DType::kBF16, du->data(), I, H},
             {DType::kBF16, dd->data(), H, I},
             T,
             dout->As<float>()},
            *stream_);
  EXPECT_TRUE(Close(Down<float>(*dout), want, kTolMlp));
}

// The same bf16 K/V values in both caches (f32 on the CPU, bf16 on the device), uploaded directly: the
// slot-mapped KV write is not implemented on the device yet.
TEST_F(BackendGpu, PagedAttentionDecodeMatchesTheCpuOracle) {
  std::mt19937_64 rng(26);
  const int num_seqs = 3, Hq = 8, Hk = 2, D = 64, bs = 16, max_blocks = 4, num_blocks = num_seqs * max_blocks;
  const size_t cache_elems = static_cast<size_t>(num_blocks) * bs * Hk * D;
  auto kc = RoundToBf16(Random(cache_elems, rng)), vc = RoundToBf16(Random(cache_elems, rng));
  const auto q = Random(static_cast<size_t>(num_seqs) * Hq * D, rng);
  std::vector<int32_t> tables(static_cast<size_t>(num_seqs) * max_blocks);
  for (size_t i = 0; i < tables.size(); ++i) tables[i] = static_cast<int32_t>((i * 5) % num_blocks);  // scattered
  const std::vector<int32_t> lens = {1, 37, 64};
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  std::vector<float> want(q.size());
  const PagedKv cpu_cache{kc.data(), vc.data(), num_blocks, bs, Hk, D, DType::kF32};
  cpu_.PagedAttentionDecode(
      {q.data(), cpu_cache, tables.data(), lens.data(), num_seqs, Hq, max_blocks, scale, want.data()}, *cpu_stream_);
  auto dk = Up(ToBf16(kc)), dv = Up(ToBf16(vc)), dq = Up(q), dt = Up(tables), dl = Up(lens);
  auto dout = gpu_->Alloc(DType::kF32, static_cast<int64_t>(q.size()));
  const PagedKv gpu_cache{dk->data(), dv->data(), num_blocks, bs, Hk, D, DType::kBF16};
  gpu_->PagedAttentionDecode({dq->As<float>(), gpu_cache, dt->As<int32_t>(), dl->As<int32_t>(), num_seqs, Hq,
                              max_blocks, scale, dout->As<float>()},
                             *stream_);
  EXPECT_TRUE(Close(Down<float>(*dout), want, kTolAttention));
  // An f32 cache is the CPU's layout, not the CUDA backend's: refused.
  EXPECT_THROW(gpu_->PagedAttentionDecode({dq->As<float>(),
                                           {dk->data(), dv->data(), num_blocks, bs, Hk, D},
                                           dt->As<int32_t>(),
                                           dl->As<int32_t>(),
                                           num_seqs,
                                           Hq,
                                           max_blocks,
                                           scale,
                                           dout->As<float>()},
                                          *stream_),
               eldr::Error);
}

TEST_F(BackendGpu, UnimplementedOperationsFailLoudly) {
  auto buf = gpu_->Alloc(DType::kF32, 8);
  auto ids = gpu_->Alloc(DType::kI32, 8);
  try {
    gpu_->ReplayTopK(
        {buf->As<float>(), nullptr, ids->As<int32_t>(), nullptr, 1, 8, 2, true, ids->As<int32_t>(), buf->As<float>()},
        *stream_);
    FAIL() << "ReplayTopK did not throw";
  } catch (const eldr::Error& e) {
    EXPECT_NE(std::string(e.what()).find("ReplayTopK is not implemented in the CUDA backend yet"), std::string::npos)
        << e.what();
  }
  // Weights of another dtype than the CUDA backend's bf16 are refused, not misread.
  EXPECT_THROW(gpu_->Linear({buf->As<float>(), {DType::kF32, buf->data(), 2, 4}, buf->As<float>(), 1}, *stream_),
               eldr::Error);
}

TEST_F(BackendGpu, EmbeddingGatherAndResidualAddMatchTheCpuOracle) {
  std::mt19937_64 rng(31);
  const int vocab = 50, H = 96, T = 7;
  const auto table = RoundToBf16(Random(static_cast<size_t>(vocab) * H, rng));
  const std::vector<int32_t> tokens = {0, 49, 3, 3, 17, 48, 1};
  std::vector<float> want(static_cast<size_t>(T) * H);
  cpu_.EmbeddingGather({{DType::kF32, table.data(), vocab, H}, tokens.data(), T, want.data()}, *cpu_stream_);
  auto dtab = Up(ToBf16(table)), dtok = Up(tokens);
  auto dout = gpu_->Alloc(DType::kF32, static_cast<int64_t>(want.size()));
  gpu_->EmbeddingGather({{DType::kBF16, dtab->data(), vocab, H}, dtok->As<int32_t>(), T, dout->As<float>()}, *stream_);
  EXPECT_EQ(Down<float>(*dout), want);  // a bf16 → fp32 copy is exact
  // out += x, exact in fp32 on both.
  const auto x = Random(want.size(), rng);
  std::vector<float> sum = want;
  cpu_.ResidualAdd({x.data(), sum.data(), static_cast<int64_t>(x.size())}, *cpu_stream_);
  auto dx = Up(x);
  gpu_->ResidualAdd({dx->As<float>(), dout->As<float>(), static_cast<int64_t>(x.size())}, *stream_);
  EXPECT_EQ(Down<float>(*dout), sum);
  // An out-of-range token: the CPU throws; the CUDA backend throws at the next synchronisation.
  std::vector<float> scratch(want.size());
  const std::vector<int32_t> bad = {0, vocab};
  EXPECT_THROW(
      cpu_.EmbeddingGather({{DType::kF32, table.data(), vocab, H}, bad.data(), 2, scratch.data()}, *cpu_stream_),
      eldr::Error);
  auto dbad = Up(std::vector<int32_t>{1, 2});
  const int32_t out_of_range = vocab;
  gpu_->CopyHostToDevice(dbad->As<int32_t>() + 1, &out_of_range, sizeof(int32_t), *stream_);
  gpu_->EmbeddingGather({{DType::kBF16, dtab->data(), vocab, H}, dbad->As<int32_t>(), 2, dout->As<float>()}, *stream_);
  EXPECT_THROW(gpu_->SynchronizeStream(*stream_), eldr::Error);
  gpu_->SynchronizeStream(*stream_);  // the error was reported once and cleared
}

TEST_F(BackendGpu, ArgMaxMatchesTheCpuIncludingNan) {
  std::mt19937_64 rng(32);
  const int rows = 6, cols = 1000;
  std::vector<float> x = Random(static_cast<size_t>(rows) * cols, rng);
  x[0 * cols + 0] = NAN;                                 // row 0: a leading NaN → 0 (std::max_element keeps it)
  x[1 * cols + 500] = NAN;                               // row 1: a NaN later is never chosen
  x[1 * cols + 501] = 100.f;                             //        ... the largest after it is
  x[2 * cols + 10] = x[2 * cols + 900] = 50.f;           // row 2: ties → the first
  for (int c = 0; c < cols; ++c) x[3 * cols + c] = NAN;  // row 3: all NaN → 0
  x[4 * cols + cols - 1] = INFINITY;                     // row 4: +inf at the end
  std::vector<int32_t> want(rows), got;
  cpu_.ArgMax({x.data(), rows, cols, want.data()}, *cpu_stream_);
  EXPECT_EQ(want[0], 0);
  EXPECT_EQ(want[1], 501);
  EXPECT_EQ(want[2], 10);
  EXPECT_EQ(want[3], 0);
  EXPECT_EQ(want[4], cols - 1);
  auto dx = Up(x);
  auto dout = gpu_->Alloc(DType::kI32, rows);
  gpu_->ArgMax({dx->As<float>(), rows, cols, dout->As<int32_t>()}, *stream_);
  EXPECT_EQ(Down<int32_t>(*dout), want);
}

TEST_F(BackendGpu, MoeCombineMatchesTheCpuOracle) {
  std::mt19937_64 rng(33);
  const int T = 5, K = 3, H = 130;
  const auto y = Random(static_cast<size_t>(T) * K * H, rng), w = Random(static_cast<size_t>(T) * K, rng);
  std::vector<float> want = Random(static_cast<size_t>(T) * H, rng);
  auto dout = Up(want);
  cpu_.MoeCombine({y.data(), w.data(), T, K, H, want.data()}, *cpu_stream_);
  auto dy = Up(y), dw = Up(w);
  gpu_->MoeCombine({dy->As<float>(), dw->As<float>(), T, K, H, dout->As<float>()}, *stream_);
  EXPECT_TRUE(Close(Down<float>(*dout), want, kTolCombine));
}

TEST_F(BackendGpu, KvSlotWritePackUnpackMatchTheCpuOracle) {
  std::mt19937_64 rng(34);
  const int num_blocks = 6, bs = 4, Hk = 2, D = 32, T = 9;
  const size_t row = static_cast<size_t>(Hk) * D, cache_elems = static_cast<size_t>(num_blocks) * bs * row;
  const auto k = RoundToBf16(Random(T * row, rng)), v = RoundToBf16(Random(T * row, rng));
  const std::vector<int64_t> slots = {5, 0, 23, 7, 12, 13, 14, 1, 20};  // distinct, scattered
  std::vector<float> kc(cache_elems, 0.f), vc(cache_elems, 0.f);
  const PagedKv cpu_cache{kc.data(), vc.data(), num_blocks, bs, Hk, D, DType::kF32};
  cpu_.WriteKvSlots({cpu_cache, slots.data(), k.data(), v.data(), T}, *cpu_stream_);
  auto dk = Up(std::vector<uint16_t>(cache_elems, 0)), dv = Up(std::vector<uint16_t>(cache_elems, 0));
  const PagedKv gpu_cache{dk->data(), dv->data(), num_blocks, bs, Hk, D, DType::kBF16};
  auto dslots = Up(slots), dkin = Up(k), dvin = Up(v);
  gpu_->WriteKvSlots({gpu_cache, dslots->As<int64_t>(), dkin->As<float>(), dvin->As<float>(), T}, *stream_);
  EXPECT_EQ(FromBf16(Down<uint16_t>(*dk)), kc);  // bf16-rounded inputs: exact
  EXPECT_EQ(FromBf16(Down<uint16_t>(*dv)), vc);
  // Pack the slots in another order, unpack into a second cache: the rows move exactly.
  const std::vector<int64_t> order = {14, 5, 20, 0};
  std::vector<float> packed(2 * order.size() * row);
  cpu_.PackKv({cpu_cache, order.data(), 4, packed.data()}, *cpu_stream_);
  auto dorder = Up(order);
  auto dpacked = gpu_->Alloc(DType::kBF16, static_cast<int64_t>(packed.size()));
  gpu_->PackKv({gpu_cache, dorder->As<int64_t>(), 4, dpacked->data()}, *stream_);
  EXPECT_EQ(FromBf16(Down<uint16_t>(*dpacked)), packed);
  auto dk2 = Up(std::vector<uint16_t>(cache_elems, 0)), dv2 = Up(std::vector<uint16_t>(cache_elems, 0));
  const PagedKv gpu_cache2{dk2->data(), dv2->data(), num_blocks, bs, Hk, D, DType::kBF16};
  std::vector<float> kc2(cache_elems, 0.f), vc2(cache_elems, 0.f);
  const PagedKv cpu_cache2{kc2.data(), vc2.data(), num_blocks, bs, Hk, D, DType::kF32};
  cpu_.UnpackKv({cpu_cache2, order.data(), 4, packed.data()}, *cpu_stream_);
  gpu_->UnpackKv({gpu_cache2, dorder->As<int64_t>(), 4, dpacked->data()}, *stream_);
  EXPECT_EQ(FromBf16(Down<uint16_t>(*dk2)), kc2);
  EXPECT_EQ(FromBf16(Down<uint16_t>(*dv2)), vc2);
  // An out-of-range slot: the CPU throws; the CUDA backend skips it and throws at the next synchronisation.
  const std::vector<int64_t> bad = {3, static_cast<int64_t>(num_blocks) * bs};
  EXPECT_THROW(cpu_.WriteKvSlots({cpu_cache, bad.data(), k.data(), v.data(), 2}, *cpu_stream_), eldr::Error);
  auto dbad = Up(bad);
  gpu_->WriteKvSlots({gpu_cache, dbad->As<int64_t>(), dkin->As<float>(), dvin->As<float>(), 2}, *stream_);
  EXPECT_THROW(gpu_->SynchronizeStream(*stream_), eldr::Error);
  gpu_->PackKv({gpu_cache, dbad->As<int64_t>(), 2, dpacked->data()}, *stream_);
  EXPECT_THROW(gpu_->SynchronizeStream(*stream_), eldr::Error);
}

}  // namespace
}  // namespace eldr::kernels
