// Every CUDA operation (kernels/cuda/cuda_ops.h) against the CPU reference (kernels/ops.h, the oracle) on
// random inputs of random and real shapes, ggml test-backend-ops style. Inputs the GPU rounds to bf16 are
// rounded the same way before the CPU sees them, so each tolerance below covers only what the GPU does
// differently: fp32 summation order, and in the MoE/MLP the bf16 storage of its intermediate activations.
// Without a CUDA device every test that needs one is skipped (GTEST_SKIP); the backend-status and
// error-macro tests run everywhere.
#include "kernels/cuda/cuda_ops.h"

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
#include "kernels/cuda/cuda_check.h"
#include "kernels/ops.h"
#include "tests/gpu/oracle.h"

namespace eldr::kernels {
namespace {

using namespace gpu_test;  // NOLINT(google-build-using-namespace): the oracle's helpers

// Owning device allocation of n elements of T; copies are synchronous.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (n_ > 0) ELDR_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr_), n_ * sizeof(T)));
  }
  explicit DeviceBuffer(const std::vector<T>& v) : DeviceBuffer(v.size()) { Upload(v); }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) (void)cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return ptr_; }
  size_t size() const { return n_; }
  void Upload(const std::vector<T>& v) {
    ELDR_CHECK(v.size() == n_, "upload of " << v.size() << " into " << n_);
    if (n_ > 0) ELDR_CUDA_CHECK(cudaMemcpy(ptr_, v.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> Download() const {
    std::vector<T> v(n_);
    if (n_ > 0) ELDR_CUDA_CHECK(cudaMemcpy(v.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }

 private:
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

// ---- tests that need no device ----

TEST(CudaBackend, StatusMatchesDeviceCount) {
  EXPECT_TRUE(CudaBackendCompiled());
  const Status s = CudaBackendStatus();
  if (cuda::DeviceCount() > 0) {
    EXPECT_TRUE(s.ok()) << s.ToString();
  } else {
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("no CUDA device"), std::string::npos) << s.message();
    EXPECT_THROW(cuda::Context ctx(0), eldr::Error);
  }
}

TEST(CudaCheck, ErrorsCarryFileLineAndLibraryName) {
  try {
    ELDR_CUDA_CHECK(cudaErrorInvalidValue);
    FAIL() << "ELDR_CUDA_CHECK did not throw";
  } catch (const eldr::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cudaErrorInvalidValue"), std::string::npos) << what;
    EXPECT_NE(what.find("cuda_ops_test.cc"), std::string::npos) << what;
    EXPECT_GT(e.line(), 0);
  }
  try {
    ELDR_CUBLAS_CHECK(CUBLAS_STATUS_NOT_SUPPORTED);
    FAIL() << "ELDR_CUBLAS_CHECK did not throw";
  } catch (const eldr::Error& e) {
    EXPECT_NE(std::string(e.what()).find("CUBLAS_STATUS_NOT_SUPPORTED"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(ELDR_CUDA_CHECK(cudaSuccess));
}

// ---- device tests ----

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    ctx_ = std::make_unique<cuda::Context>(0);
    ELDR_CUDA_CHECK(cudaStreamCreate(&stream_));
  }
  void TearDown() override {
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  }
  void Sync() { ELDR_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

  // Both ways of running the expert GEMMs, when the library has the grouped one.
  std::vector<bool> GemmModes() const {
    return cuda::Context::GroupedGemmAvailable() ? std::vector<bool>{true, false} : std::vector<bool>{false};
  }

  void CheckMoe(int T, int E, int K, int H, int I, const std::vector<int32_t>& ids, std::mt19937_64& rng,
                const std::string& what);

  std::unique_ptr<cuda::Context> ctx_;
  cudaStream_t stream_ = nullptr;
};

TEST_F(CudaOps, ConvertToBf16IsRoundToNearestEven) {
  std::mt19937_64 rng(1);
  std::vector<float> x = Random(10007, rng, 3.f);
  const float specials[] = {0.f,      -0.f,      1.f + 1.f / 256, 1.f + 3.f / 256, -1.f - 1.f / 256, 3.3e38f, -3.3e38f,
                            INFINITY, -INFINITY, 1e-40f,          -1e-40f,         1e-38f,           65504.f, 1.f / 3};
  x.insert(x.end(), std::begin(specials), std::end(specials));
  DeviceBuffer<float> dx(x);
  DeviceBuffer<uint16_t> dy(x.size());
  cuda::ConvertToBf16(dx.get(), dy.get(), static_cast<int64_t>(x.size()), stream_);
  Sync();
  EXPECT_EQ(dy.Download(), ToBf16(x));
}

TEST_F(CudaOps, FillUniformBf16IsSeededAndUniform) {
  const int64_t n = 1 << 20;
  const float scale = 0.5f;
  DeviceBuffer<uint16_t> a(n), b(n), c(n);
  cuda::FillUniformBf16(a.get(), n, scale, 7, stream_);
  cuda::FillUniformBf16(b.get(), n, scale, 7, stream_);
  cuda::FillUniformBf16(c.get(), n, scale, 8, stream_);
  Sync();
  const auto va = a.Download();
  EXPECT_EQ(va, b.Download());
  EXPECT_NE(va, c.Download());
  double sum = 0, sq = 0;
  for (uint16_t bits : va) {
    const double v = Bf16ToFloat(bits);
    ASSERT_LE(std::abs(v), scale);
    sum += v;
    sq += v * v;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.005);
  EXPECT_NEAR(sq / n, scale * scale / 3, 0.02 * scale * scale / 3);
}

TEST_F(CudaOps, RmsNorm) {
  std::mt19937_64 rng(2);
  const int shapes[][2] = {{1, 32}, {5, 37}, {16, 2048}, {3, 4099}, {64, 2048}};
  for (const auto& s : shapes) {
    const int T = s[0], H = s[1];
    const std::string what = "rmsnorm " + std::to_string(T) + "x" + std::to_string(H);
    auto x = Random(static_cast<size_t>(T) * H, rng, 2.f), w = Random(H, rng);
    std::vector<float> ref(x.size());
    RmsNorm({x.data(), w.data(), ref.data(), T, H, 1e-6f});
    DeviceBuffer<float> dx(x), dw(w), dout(x.size());
    cuda::RmsNorm({dx.get(), dw.get(), dout.get(), T, H, 1e-6f}, stream_);
    cuda::RmsNorm({dx.get(), dw.get(), dx.get(), T, H, 1e-6f}, stream_);  // in place
    Sync();
    EXPECT_TRUE(Close(dout.Download(), ref, kTolRmsNorm)) << what;
    EXPECT_TRUE(Close(dx.Download(), ref, kTolRmsNorm)) << what << " in place";
  }
}

TEST_F(CudaOps, ApplyRope) {
  std::mt19937_64 rng(3);
  struct Shape {
    int T, Hq, Hk, D;
  };
  const Shape shapes[] = {{1, 1, 1, 2}, {7, 6, 2, 64}, {3, 32, 4, 128}, {20, 4, 4, 80}, {5, 16, 2, 256}};
  for (const Shape& s : shapes) {
    const std::string what = "rope T=" + std::to_string(s.T) + " D=" + std::to_string(s.D);
    auto q = Random(static_cast<size_t>(s.T) * s.Hq * s.D, rng), k = Random(static_cast<size_t>(s.T) * s.Hk * s.D, rng);
    std::vector<int32_t> pos(s.T);
    for (auto& p : pos) p = static_cast<int32_t>(rng() % 40000);
    pos[0] = 0;
    DeviceBuffer<float> dq(q), dk(k);
    DeviceBuffer<int32_t> dpos(pos);
    ApplyRope({q.data(), k.data(), pos.data(), s.T, s.Hq, s.Hk, s.D, 1e6f});
    cuda::ApplyRope({dq.get(), dk.get(), dpos.get(), s.T, s.Hq, s.Hk, s.D, 1e6f}, stream_);
    Sync();
    EXPECT_TRUE(Close(dq.Download(), q, kTolRope)) << what << " q";
    EXPECT_TRUE(Close(dk.Download(), k, kTolRope)) << what << " k";
  }
}

TEST_F(CudaOps, Linear) {
  std::mt19937_64 rng(4);
  const int shapes[][3] = {{1, 37, 19}, {7, 2048, 128}, {16, 128, 2048}, {33, 100, 300}, {64, 2048, 151}, {1, 8, 1}};
  for (const auto& s : shapes) {
    const int T = s[0], In = s[1], Out = s[2];
    const std::string what = "linear " + std::to_string(T) + "x" + std::to_string(In) + "->" + std::to_string(Out);
    const auto x = RoundToBf16(Random(static_cast<size_t>(T) * In, rng));
    const auto w = ToBf16(Random(static_cast<size_t>(Out) * In, rng, 1.f / std::sqrt(static_cast<float>(In))));
    std::vector<float> ref(static_cast<size_t>(T) * Out);
    Linear({x.data(), {DType::kBF16, w.data(), Out, In}, ref.data(), T});
    DeviceBuffer<float> dx(x), dy(ref.size());
    DeviceBuffer<uint16_t> dw(w);
    cuda::Linear(*ctx_, {dx.get(), dw.get(), dy.get(), T, In, Out}, stream_);
    Sync();
    EXPECT_TRUE(Close(dy.Download(), ref, kTolLinear)) << what;
  }
}

TEST_F(CudaOps, GateTopK) {
  std::mt19937_64 rng(5);
  const int shapes[][3] = {{1, 8, 1}, {37, 60, 4}, {16, 128, 8}, {64, 128, 8}, {5, 160, 6}, {3, 513, 8}, {2, 4, 4}};
  for (const auto& s : shapes) {
    const int T = s[0], E = s[1], K = s[2];
    auto logits = Random(static_cast<size_t>(T) * E, rng, 2.f);
    // Exact ties, which must go to the lower expert id.
    for (int t = 0; t < T; ++t) {
      const int a = static_cast<int>(rng() % E), b = static_cast<int>(rng() % E);
      logits[static_cast<size_t>(t) * E + b] = logits[static_cast<size_t>(t) * E + a] = 3.f;
    }
    DeviceBuffer<float> dlogits(logits), dw(static_cast<size_t>(T) * K);
    DeviceBuffer<int32_t> dids(static_cast<size_t>(T) * K);
    for (bool renorm : {true, false}) {
      const std::string what = "gate T=" + std::to_string(T) + " E=" + std::to_string(E) + " K=" + std::to_string(K) +
                               (renorm ? " renormalised" : "");
      std::vector<int32_t> ids(static_cast<size_t>(T) * K);
      std::vector<float> w(ids.size());
      GateTopK({logits.data(), T, E, K, renorm, ids.data(), w.data()});
      cuda::GateTopK({dlogits.get(), T, E, K, renorm, dids.get(), dw.get()}, stream_);
      Sync();
      const auto gids = dids.Download();
      const auto gw = dw.Download();
      // Ids exactly, except where two different logits are within fp32 noise (a near-tie the CPU's double
      // softmax may order otherwise); such a token's weights are then not compared either.
      std::vector<float> w_cmp, gw_cmp;
      for (int t = 0; t < T; ++t) {
        bool near_tie = false;
        for (int j = 0; j < K; ++j) {
          const size_t i = static_cast<size_t>(t) * K + j;
          if (gids[i] == ids[i]) continue;
          const float a = logits[static_cast<size_t>(t) * E + ids[i]];
          const float b = gids[i] >= 0 && gids[i] < E ? logits[static_cast<size_t>(t) * E + gids[i]] : NAN;
          near_tie = a != b && std::abs(a - b) <= 1e-6f * (1.f + std::abs(a));
          ASSERT_TRUE(near_tie) << what << ": token " << t << " slot " << j << " GPU expert " << gids[i]
                                << ", CPU expert " << ids[i];
        }
        if (near_tie) continue;
        for (int j = 0; j < K; ++j) {
          w_cmp.push_back(w[static_cast<size_t>(t) * K + j]);
          gw_cmp.push_back(gw[static_cast<size_t>(t) * K + j]);
        }
      }
      EXPECT_TRUE(Close(gw_cmp, w_cmp, kTolGateWeight)) << what;
    }
  }
}

TEST_F(CudaOps, GroupByExpertEqualsCpuGrouping) {
  std::mt19937_64 rng(6);
  const int shapes[][4] = {{1, 1, 4, 4},     {7, 2, 5, 5},   {64, 8, 128, 128}, {1000, 8, 128, 20},
                           {1, 8, 160, 160}, {300, 1, 3, 3}, {16, 8, 128, 8}};
  for (const auto& s : shapes) {
    const int T = s[0], K = s[1], E = s[2], hot = s[3];  // ids from the first `hot` experts
    const std::string what = "group T=" + std::to_string(T) + " K=" + std::to_string(K) + " E=" + std::to_string(E);
    std::vector<int32_t> ids(static_cast<size_t>(T) * K);
    for (auto& id : ids) id = static_cast<int32_t>(rng() % hot);  // duplicates within a token allowed
    ExpertGrouping ref;
    GroupByExpert(ids.data(), T, K, E, &ref);
    DeviceBuffer<int32_t> dids(ids), doffsets(E + 1), dpairs(ids.size()), drows(ids.size());
    cuda::GroupByExpert({dids.get(), T, K, E, doffsets.get(), dpairs.get(), drows.get()}, stream_);
    Sync();
    EXPECT_EQ(doffsets.Download(), ref.offsets) << what;
    const auto pairs = dpairs.Download();
    EXPECT_EQ(pairs, ref.pairs) << what;
    const auto rows = drows.Download();
    for (size_t i = 0; i < ids.size(); ++i) {
      ASSERT_GE(rows[i], 0) << what;
      ASSERT_LT(static_cast<size_t>(rows[i]), ids.size()) << what;
      ASSERT_EQ(pairs[rows[i]], static_cast<int32_t>(i)) << what;
    }
  }
}

TEST_F(CudaOps, PermuteAndCombine) {
  std::mt19937_64 rng(7);
  const int T = 37, K = 3, E = 9, H = 101;
  const int64_t stride = 104;
  const int n = T * K;
  const auto ids = RandomTopK(T, E, K, rng);
  ExpertGrouping g;
  GroupByExpert(ids.data(), T, K, E, &g);
  std::vector<int32_t> rows(n);
  for (int r = 0; r < n; ++r) rows[g.pairs[r]] = r;
  const auto x = Random(static_cast<size_t>(T) * H, rng);
  DeviceBuffer<float> dx(x);
  DeviceBuffer<int32_t> dpairs(g.pairs), drows(rows);
  DeviceBuffer<uint16_t> dxp(static_cast<size_t>(n) * stride);
  cuda::Permute({dx.get(), dpairs.get(), n, K, H, dxp.get(), stride}, stream_);
  Sync();
  const auto xp = dxp.Download();
  for (int r = 0; r < n; ++r) {
    const int t = g.pairs[r] / K;
    for (int c = 0; c < H; ++c) {
      ASSERT_EQ(xp[r * stride + c], FloatToBf16(x[static_cast<size_t>(t) * H + c])) << "row " << r << " col " << c;
    }
  }

  const auto y = ToBf16(Random(static_cast<size_t>(n) * stride, rng));
  const auto w = RandomTopKWeights(T, K, rng);
  const auto init = Random(static_cast<size_t>(T) * H, rng);
  std::vector<float> ref = init;
  for (int t = 0; t < T; ++t) {
    for (int j = 0; j < K; ++j) {
      const int r = rows[t * K + j];
      for (int c = 0; c < H; ++c) ref[static_cast<size_t>(t) * H + c] += w[t * K + j] * Bf16ToFloat(y[r * stride + c]);
    }
  }
  DeviceBuffer<uint16_t> dy(y);
  DeviceBuffer<float> dw(w), dout(init);
  cuda::Combine({dy.get(), stride, drows.get(), dw.get(), T, K, H, dout.get()}, stream_);
  Sync();
  EXPECT_TRUE(Close(dout.Download(), ref, kTolCombine));
}

// Experts with random bf16 weights generated on the device, each matrix at a 16-byte aligned offset of one
// packed buffer; the CPU reference reads the same bf16 values.
void CudaOps::CheckMoe(int T, int E, int K, int H, int I, const std::vector<int32_t>& ids, std::mt19937_64& rng,
                       const std::string& what) {
  const int64_t per = (static_cast<int64_t>(I) * H + 7) / 8 * 8;  // elements per expert matrix, 16-byte aligned
  DeviceBuffer<uint16_t> dgate(E * per), dup(E * per), ddown(E * per);
  const uint64_t seed = rng();
  cuda::FillUniformBf16(dgate.get(), E * per, std::sqrt(3.f / H), seed, stream_);
  cuda::FillUniformBf16(dup.get(), E * per, std::sqrt(3.f / H), seed + 1, stream_);
  cuda::FillUniformBf16(ddown.get(), E * per, std::sqrt(3.f / I), seed + 2, stream_);
  Sync();
  const auto gate = dgate.Download(), up = dup.Download(), down = ddown.Download();

  ExpertWeights cpu_w;
  cuda::ExpertWeights gpu_w;
  cpu_w.num_experts = gpu_w.num_experts = E;
  cpu_w.hidden = gpu_w.hidden = H;
  cpu_w.intermediate = gpu_w.intermediate = I;
  for (int e = 0; e < E; ++e) {
    cpu_w.gate_proj.push_back({DType::kBF16, gate.data() + e * per, I, H});
    cpu_w.up_proj.push_back({DType::kBF16, up.data() + e * per, I, H});
    cpu_w.down_proj.push_back({DType::kBF16, down.data() + e * per, H, I});
    gpu_w.gate_proj.push_back(dgate.get() + e * per);
    gpu_w.up_proj.push_back(dup.get() + e * per);
    gpu_w.down_proj.push_back(ddown.get() + e * per);
  }
  const auto x = RoundToBf16(Random(static_cast<size_t>(T) * H, rng));
  const auto w = RandomTopKWeights(T, K, rng);
  const auto init = Random(static_cast<size_t>(T) * H, rng, 0.5f);
  std::vector<float> ref = init;
  MoeExperts({x.data(), ids.data(), w.data(), T, K, &cpu_w, ref.data()});
  const auto ref_delta = Minus(ref, init);

  DeviceBuffer<float> dx(x), dw(w), dout(init.size());
  DeviceBuffer<int32_t> dids(ids);
  // The host schedule (no error word), both GEMM modes of cuBLAS.
  for (bool grouped : GemmModes()) {
    ctx_->set_grouped_gemm(grouped);
    dout.Upload(init);
    cuda::MoeExperts(*ctx_, {dx.get(), dids.get(), dw.get(), T, K, &gpu_w, dout.get()}, stream_);
    Sync();
    EXPECT_EQ(ctx_->grouped_gemm(), grouped) << what << ": cuBLAS refused the grouped GEMM (NOT_SUPPORTED)";
    // Compare what was added: out is accumulated into.
    EXPECT_TRUE(Close(Minus(dout.Download(), init), ref_delta, kTolMoe))
        << what << (grouped ? " (grouped GEMM)" : " (GEMM per expert)");
  }
  ctx_->set_grouped_gemm(cuda::Context::GroupedGemmAvailable());
  // The device schedule (an error word; the default), with the table copied per call: the same result, no error.
  DeviceBuffer<int> error(std::vector<int>{0});
  ASSERT_TRUE(ctx_->device_schedule());
  dout.Upload(init);
  cuda::MoeExperts(*ctx_, {dx.get(), dids.get(), dw.get(), T, K, &gpu_w, dout.get(), error.get()}, stream_);
  Sync();
  EXPECT_EQ(error.Download()[0], 0) << what << " (device schedule)";
  EXPECT_TRUE(Close(Minus(dout.Download(), init), ref_delta, kTolMoe)) << what << " (device schedule)";
  // The pointer table resident on the device (UploadExpertTable): the same result, no per-call table copy, under
  // both schedules.
  DeviceBuffer<int64_t> dtable(3 * static_cast<int64_t>(E));
  cuda::UploadExpertTable(gpu_w, reinterpret_cast<const void**>(dtable.get()), stream_);
  gpu_w.device_table = reinterpret_cast<const void* const*>(dtable.get());
  for (int* word : {static_cast<int*>(nullptr), error.get()}) {
    dout.Upload(init);
    cuda::MoeExperts(*ctx_, {dx.get(), dids.get(), dw.get(), T, K, &gpu_w, dout.get(), word}, stream_);
    Sync();
    EXPECT_TRUE(Close(Minus(dout.Download(), init), ref_delta, kTolMoe))
        << what << " (resident pointer table, " << (word ? "device" : "host") << " schedule)";
  }
  EXPECT_EQ(error.Download()[0], 0) << what;
}

// Scratch reserved for the largest batch: MoE layers at that batch and below never allocate again (no cudaFree,
// which synchronises the device, inside a decode step).
TEST_F(CudaOps, ScratchReservedForTheMaxBatchNeverGrows) {
  std::mt19937_64 rng(12);
  const int max_T = 64, E = 16, K = 4, H = 64, I = 32;
  ctx_ = std::make_unique<cuda::Context>(0);
  EXPECT_EQ(ctx_->scratch_grows(), 0);
  ctx_->Reserve(std::max(cuda::MoeScratchBytes(max_T, K, E, H, I), cuda::MlpScratchBytes(max_T, H, I)), stream_);
  EXPECT_EQ(ctx_->scratch_grows(), 1);
  EXPECT_GE(ctx_->scratch_bytes(), cuda::MoeScratchBytes(max_T, K, E, H, I));
  for (int T : {max_T, 1, 17, max_T})
    CheckMoe(T, E, K, H, I, RandomTopK(T, E, K, rng), rng, "reserved T=" + std::to_string(T));
  EXPECT_EQ(ctx_->scratch_grows(), 1);
  // Beyond the reservation it still works, growing once.
  CheckMoe(2 * max_T, E, K, H, I, RandomTopK(2 * max_T, E, K, rng), rng, "beyond the reservation");
  EXPECT_EQ(ctx_->scratch_grows(), 2);
}

TEST_F(CudaOps, MoeExpertsRandomShapes) {
  std::mt19937_64 rng(8);
  for (int trial = 0; trial < 8; ++trial) {
    const int T = 1 + static_cast<int>(rng() % 40), E = 4 + static_cast<int>(rng() % 17);
    const int K = 1 + static_cast<int>(rng() % 4);
    const int hs[] = {24, 37, 64, 100}, is[] = {12, 33, 70};
    const int H = hs[rng() % 4], I = is[rng() % 3];
    // Half the trials route to a few hot experts only, so counts per expert vary widely.
    const int hot = trial % 2 == 0 ? E : std::max(K, 2 + static_cast<int>(rng() % 3));
    CheckMoe(T, E, K, H, I, RandomTopK(T, hot, K, rng), rng,
             "moe T=" + std::to_string(T) + " E=" + std::to_string(E) + " K=" + std::to_string(K) +
                 " H=" + std::to_string(H) + " I=" + std::to_string(I));
  }
}

// The Qwen3-30B-A3B layer: hidden 2048, moe_intermediate 768, 128 experts, top-8.
TEST_F(CudaOps, MoeExpertsQwen3LayerShape) {
  std::mt19937_64 rng(9);
  const int E = 128, K = 8, H = 2048, I = 768;
  for (int T : {16, 64}) {
    CheckMoe(T, E, K, H, I, RandomTopK(T, E, K, rng), rng, "qwen3 moe random routing, batch " + std::to_string(T));
  }
  // 16 distinct experts at batch 64: 32 tokens per expert GEMM.
  std::vector<int32_t> rr(64 * K);
  for (size_t i = 0; i < rr.size(); ++i) rr[i] = static_cast<int32_t>(i % 16);
  CheckMoe(64, E, K, H, I, rr, rng, "qwen3 moe 16 distinct experts, batch 64");
}

// The DeepSeek-V2-Lite layer (the simulator's H200 cost model): hidden 2048, moe_intermediate 1408 (44 column
// blocks of the device schedule's GEMM), 64 routed experts, top-6; at batch 64 with 8 experts, 48 rows per
// expert: three tiles each.
TEST_F(CudaOps, MoeExpertsDeepSeekV2LiteLayerShape) {
  std::mt19937_64 rng(13);
  const int E = 64, K = 6, H = 2048, I = 1408;
  for (int T : {1, 16, 64}) {
    CheckMoe(T, E, K, H, I, RandomTopK(T, E, K, rng), rng, "dsv2-lite moe random routing, batch " + std::to_string(T));
  }
  std::vector<int32_t> rr(64 * K);
  for (size_t i = 0; i < rr.size(); ++i) rr[i] = static_cast<int32_t>(i % 8);
  CheckMoe(64, E, K, H, I, rr, rng, "dsv2-lite moe 8 distinct experts, batch 64");
}

TEST_F(CudaOps, MoeExpertsRejectsBadIdsAndMissingExperts) {
  const int T = 2, K = 2, E = 4, H = 16, I = 8;
  DeviceBuffer<uint16_t> wts(static_cast<size_t>(E) * I * H);
  cuda::FillUniformBf16(wts.get(), static_cast<int64_t>(wts.size()), 0.1f, 1, stream_);
  cuda::ExpertWeights w;
  w.num_experts = E;
  w.hidden = H;
  w.intermediate = I;
  for (int e = 0; e < E; ++e) {
    const uint16_t* p = wts.get() + static_cast<size_t>(e) * I * H;
    w.gate_proj.push_back(p);
    w.up_proj.push_back(p);
    w.down_proj.push_back(p);
  }
  DeviceBuffer<float> x(std::vector<float>(T * H, 1.f)), wt(std::vector<float>(T * K, 0.5f)), out(T * H);
  DeviceBuffer<int32_t> bad(std::vector<int32_t>{0, 1, 2, E});
  EXPECT_THROW(cuda::MoeExperts(*ctx_, {x.get(), bad.get(), wt.get(), T, K, &w, out.get()}, stream_), eldr::Error);
  DeviceBuffer<int32_t> good(std::vector<int32_t>{0, 1, 2, 3});
  w.down_proj[3] = nullptr;
  EXPECT_THROW(cuda::MoeExperts(*ctx_, {x.get(), good.get(), wt.get(), T, K, &w, out.get()}, stream_), eldr::Error);
  Sync();
  // The device schedule cannot throw from a kernel: the same two cases set kErrorExpert and skip those pairs.
  DeviceBuffer<int> error(std::vector<int>{0});
  w.down_proj[3] = w.down_proj[2];
  const std::vector<float> zero(T * H, 0.f);
  out.Upload(zero);
  cuda::MoeExperts(*ctx_, {x.get(), bad.get(), wt.get(), T, K, &w, out.get(), error.get()}, stream_);
  Sync();
  EXPECT_EQ(error.Download()[0], cuda::kErrorExpert);
  // Token 1's valid pair (expert 2, weight 0.5) still contributes and its invalid one (id E) adds nothing: out row 1
  // equals that of the call with ids {2, 2} and weights {0.5, 0}.
  const std::vector<float> with_bad = out.Download();
  DeviceBuffer<int32_t> twice(std::vector<int32_t>{0, 1, 2, 2});
  DeviceBuffer<float> wt_one(std::vector<float>{0.5f, 0.5f, 0.5f, 0.f});
  out.Upload(zero);
  cuda::MoeExperts(*ctx_, {x.get(), twice.get(), wt_one.get(), T, K, &w, out.get(), error.get()}, stream_);
  Sync();
  const std::vector<float> alone = out.Download();
  for (int c = 0; c < H; ++c) EXPECT_FLOAT_EQ(with_bad[H + c], alone[H + c]) << "column " << c;
  DeviceBuffer<int> error2(std::vector<int>{0});
  w.down_proj[3] = nullptr;
  cuda::MoeExperts(*ctx_, {x.get(), good.get(), wt.get(), T, K, &w, out.get(), error2.get()}, stream_);
  Sync();
  EXPECT_EQ(error2.Download()[0], cuda::kErrorExpert);
}

TEST_F(CudaOps, Mlp) {
  std::mt19937_64 rng(10);
  const int shapes[][3] = {{3, 40, 24}, {1, 37, 19}, {16, 2048, 768}, {64, 512, 1408}};
  for (const auto& s : shapes) {
    const int T = s[0], H = s[1], I = s[2];
    const std::string what = "mlp T=" + std::to_string(T) + " H=" + std::to_string(H) + " I=" + std::to_string(I);
    const auto gate = ToBf16(Random(static_cast<size_t>(I) * H, rng, 1.f / std::sqrt(static_cast<float>(H))));
    const auto up = ToBf16(Random(static_cast<size_t>(I) * H, rng, 1.f / std::sqrt(static_cast<float>(H))));
    const auto down = ToBf16(Random(static_cast<size_t>(H) * I, rng, 1.f / std::sqrt(static_cast<float>(I))));
    const auto x = RoundToBf16(Random(static_cast<size_t>(T) * H, rng));
    const auto init = Random(x.size(), rng, 0.5f);
    std::vector<float> ref = init;
    Mlp({x.data(),
         {DType::kBF16, gate.data(), I, H},
         {DType::kBF16, up.data(), I, H},
         {DType::kBF16, down.data(), H, I},
         T,
         ref.data()});
    DeviceBuffer<uint16_t> dg(gate), du(up), dd(down);
    DeviceBuffer<float> dx(x), dout(init);
    cuda::Mlp(*ctx_, {dx.get(), dg.get(), du.get(), dd.get(), T, H, I, dout.get()}, stream_);
    Sync();
    EXPECT_TRUE(Close(Minus(dout.Download(), init), Minus(ref, init), kTolMlp)) << what;
  }
}

// Several sequences of different lengths in one paged cache with scattered blocks: WriteKv (in two chunks per
// sequence) must store exactly bf16(k), bf16(v) where the CPU stores them; decode and prefill attention must
// match the CPU on the same cached values.
TEST_F(CudaOps, PagedKvWriteDecodeAndPrefill) {
  std::mt19937_64 rng(11);
  struct Config {
    int Hq, Hk, D, block_size;
    std::vector<int> lens;
  };
  const Config configs[] = {
      {4, 2, 8, 4, {11, 5, 1}},
      {32, 4, 128, 16, {1, 17, 300, 64, 129}},  // Qwen3-30B-A3B attention: 32 query heads, 4 KV heads
      {6, 6, 80, 7, {50, 3, 23}},
      {8, 1, 256, 32, {97, 200}},
  };
  for (const Config& c : configs) {
    const std::string what = "attention Hq=" + std::to_string(c.Hq) + " Hk=" + std::to_string(c.Hk) +
                             " D=" + std::to_string(c.D) + " bs=" + std::to_string(c.block_size);
    const int S = static_cast<int>(c.lens.size());
    int max_blocks = 0, used_blocks = 0;
    for (int len : c.lens) {
      const int b = (len + c.block_size - 1) / c.block_size;
      max_blocks = std::max(max_blocks, b);
      used_blocks += b;
    }
    const int num_blocks = used_blocks + 5;  // spare blocks stay zero
    std::vector<int32_t> pool(num_blocks);
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), rng);
    std::vector<int32_t> tables(static_cast<size_t>(S) * max_blocks, 0);
    for (int s = 0, next = 0; s < S; ++s) {
      for (int b = 0; b < (c.lens[s] + c.block_size - 1) / c.block_size; ++b) tables[s * max_blocks + b] = pool[next++];
    }
    const int64_t row = static_cast<int64_t>(c.Hk) * c.D;
    const size_t cache_elems = static_cast<size_t>(num_blocks) * c.block_size * row;
    std::vector<float> kc(cache_elems, 0.f), vc(cache_elems, 0.f);
    PagedKv cpu_cache{kc.data(), vc.data(), num_blocks, c.block_size, c.Hk, c.D};
    DeviceBuffer<uint16_t> dkc(cache_elems), dvc(cache_elems);
    ELDR_CUDA_CHECK(cudaMemset(dkc.get(), 0, cache_elems * sizeof(uint16_t)));
    ELDR_CUDA_CHECK(cudaMemset(dvc.get(), 0, cache_elems * sizeof(uint16_t)));
    cuda::PagedKv gpu_cache{dkc.get(), dvc.get(), num_blocks, c.block_size, c.Hk, c.D};
    DeviceBuffer<int32_t> dtables(tables);

    for (int s = 0; s < S; ++s) {
      const int len = c.lens[s];
      const auto k = Random(static_cast<size_t>(len) * row, rng), v = Random(static_cast<size_t>(len) * row, rng);
      const int split = len / 2;  // chunk [0, split) then [split, len)
      for (const auto& [begin, end] : {std::pair<int, int>{0, split}, std::pair<int, int>{split, len}}) {
        if (begin == end) continue;
        std::vector<int32_t> pos(end - begin);
        std::iota(pos.begin(), pos.end(), begin);
        const std::vector<float> kk(k.begin() + begin * row, k.begin() + end * row);
        const std::vector<float> vv(v.begin() + begin * row, v.begin() + end * row);
        const auto kr = RoundToBf16(kk), vr = RoundToBf16(vv);
        WriteKv({cpu_cache, tables.data() + s * max_blocks, pos.data(), kr.data(), vr.data(), end - begin});
        DeviceBuffer<float> dk(kk), dv(vv);
        DeviceBuffer<int32_t> dpos(pos);
        cuda::WriteKv({gpu_cache, dtables.get() + s * max_blocks, dpos.get(), dk.get(), dv.get(), end - begin},
                      stream_);
        Sync();  // the chunk's buffers die at the end of this iteration
      }
    }
    EXPECT_EQ(dkc.Download(), ToBf16(kc)) << what << " K cache";
    EXPECT_EQ(dvc.Download(), ToBf16(vc)) << what << " V cache";

    const float scale = 1.f / std::sqrt(static_cast<float>(c.D));
    // Decode: one query per sequence over its whole context.
    const auto q = Random(static_cast<size_t>(S) * c.Hq * c.D, rng);
    std::vector<int32_t> lens(c.lens.begin(), c.lens.end());
    std::vector<float> ref(q.size());
    PagedAttentionDecode({q.data(), cpu_cache, tables.data(), lens.data(), S, c.Hq, max_blocks, scale, ref.data()});
    DeviceBuffer<float> dq(q), dout(q.size());
    DeviceBuffer<int32_t> dlens(lens);
    cuda::PagedAttentionDecode(
        {dq.get(), gpu_cache, dtables.get(), dlens.get(), S, c.Hq, max_blocks, scale, dout.get()}, stream_);
    Sync();
    EXPECT_TRUE(Close(dout.Download(), ref, kTolAttention)) << what << " decode";

    // Prefill of the longest sequence's last two thirds, the first third already cached.
    const int s = static_cast<int>(std::max_element(lens.begin(), lens.end()) - lens.begin());
    const int start = lens[s] / 3, num = lens[s] - start;
    const auto pq = Random(static_cast<size_t>(num) * c.Hq * c.D, rng);
    std::vector<float> pref(pq.size());
    PrefillAttention({pq.data(), cpu_cache, tables.data() + s * max_blocks, start, num, c.Hq, scale, pref.data()});
    DeviceBuffer<float> dpq(pq), dpout(pq.size());
    cuda::PrefillAttention({dpq.get(), gpu_cache, dtables.get() + s * max_blocks, start, num, c.Hq, scale, dpout.get()},
                           stream_);
    Sync();
    EXPECT_TRUE(Close(dpout.Download(), pref, kTolAttention)) << what << " prefill";
  }
}

TEST_F(CudaOps, SignatureCountsEqualCpu) {
  std::mt19937_64 rng(12);
  const int shapes[][4] = {{1, 1, 1, 4},   {5, 2, 2, 4},     {100, 8, 16, 128},
                           {77, 8, 7, 60}, {16, 8, 16, 128}, {1000, 6, 16, 64}};
  for (const auto& s : shapes) {
    const int T = s[0], K = s[1], bs = s[2], E = s[3];
    const std::string what = "signature T=" + std::to_string(T) + " K=" + std::to_string(K) +
                             " bs=" + std::to_string(bs) + " E=" + std::to_string(E);
    const int64_t stride = E + 5;
    const int blocks = (T + bs - 1) / bs;
    std::vector<int32_t> ids(static_cast<size_t>(T) * K);
    for (auto& id : ids) id = static_cast<int32_t>(rng() % E);
    std::vector<int8_t> rows(static_cast<size_t>(blocks) * stride);
    for (auto& r : rows) r = static_cast<int8_t>(rng() % 20);  // counts are added to what is there
    DeviceBuffer<int32_t> dids(ids);
    DeviceBuffer<int8_t> drows(rows);
    AccumulateSignatureCounts({ids.data(), T, K, bs, rows.data(), stride});
    cuda::AccumulateSignatureCounts({dids.get(), T, K, bs, E, drows.get(), stride}, stream_);
    Sync();
    EXPECT_EQ(drows.Download(), rows) << what;
  }
}

}  // namespace
}  // namespace eldr::kernels
