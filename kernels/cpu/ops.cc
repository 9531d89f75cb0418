// CPU reference implementation of kernels/ops.h: batch-invariant matrix products on Eigen's SIMD packets,
// plain loops elsewhere, parallelised over independent work (tokens, experts, sequence × head) with ParallelFor.
#include "kernels/ops.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "runtime/common/check.h"
#include "runtime/common/parallel.h"

namespace eldr::kernels {

namespace {

// fp32 view of a weight matrix: the data itself, or a thread-local converted copy for bf16.
const float* AsF32(const WeightMatrix& w, std::vector<float>* scratch) {
  if (w.dtype == DType::kF32) return static_cast<const float*>(w.data);
  const size_t n = static_cast<size_t>(w.rows) * w.cols;
  scratch->resize(n);
  const uint16_t* src = static_cast<const uint16_t*>(w.data);
  for (size_t i = 0; i < n; ++i) (*scratch)[i] = Bf16ToFloat(src[i]);
  return scratch->data();
}

// Batch-invariant products. Every y[t, o] = x[t] · W[o] is computed by the same sequence of operations on
// x[t] and W[o] alone: one packet-wide multiply-add chain over the row's full packets (column order), a fixed
// horizontal sum, then the leftover columns in order with fma. Nothing depends on n, on where token t sits
// in the batch, or on how Linear splits the tokens over threads. So a token decoded in a batch of 8 gets the
// same logits as alone, and a prefill that starts after a prefix hit computes the same values as a cold one:
// `eldr serve` decodes the same tokens as a single-sequence run. (Eigen's GEMM rounded a row differently
// depending on the row count, and the dot product it was switched with below 5 rows summed in another order.)
// Speed: register tiles of R weight rows × T tokens (a weight packet loaded once serves T tokens, an input
// packet R rows), cache blocks of kTokenBlock tokens × kRowBlock rows.
namespace simd = Eigen::internal;
using Packet = simd::packet_traits<float>::type;
constexpr int kPacket = simd::packet_traits<float>::size;
constexpr int64_t kTokenBlock = 64, kRowBlock = 16;

// y[t * y_stride + r] = W[r] · x[t] for r < R, t < T. w: [R, cols] rows, x: [T, cols].
template <int R, int T>
inline void DotTile(const float* w, const float* x, int64_t cols, float* y, int64_t y_stride) {
  Packet acc[R][T];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) acc[r][t] = simd::pset1<Packet>(0.f);
  }
  const int64_t full = cols / kPacket * kPacket;
  for (int64_t k = 0; k < full; k += kPacket) {
    Packet xv[T];
    for (int t = 0; t < T; ++t) xv[t] = simd::ploadu<Packet>(x + t * cols + k);
    for (int r = 0; r < R; ++r) {
      const Packet wv = simd::ploadu<Packet>(w + r * cols + k);
      for (int t = 0; t < T; ++t) acc[r][t] = simd::pmadd(wv, xv[t], acc[r][t]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      float sum = simd::predux(acc[r][t]);
      for (int64_t k = full; k < cols; ++k) sum = std::fma(w[r * cols + k], x[t * cols + k], sum);
      y[t * y_stride + r] = sum;
    }
  }
}

// T tokens against `rows` weight rows (fewer tokens per tile: more rows, to keep enough independent chains).
template <int T>
void DotRows(const float* w, int64_t rows, int64_t cols, const float* x, float* y, int64_t y_stride) {
  constexpr int R = T <= 2 ? 8 : 4;
  int64_t o = 0;
  for (; o + R <= rows; o += R) DotTile<R, T>(w + o * cols, x, cols, y + o, y_stride);
  for (; o < rows; ++o) DotTile<1, T>(w + o * cols, x, cols, y + o, y_stride);
}

// y[n, out] = x[n, in] · W^T, W [out, in]; batch-invariant (above).
void MatMulT(const float* x, int64_t n, const WeightMatrix& w, float* y) {
  thread_local std::vector<float> scratch;
  const float* wf = AsF32(w, &scratch);
  const int64_t rows = w.rows, cols = w.cols;
  for (int64_t t0 = 0; t0 < n; t0 += kTokenBlock) {
    const int64_t t1 = std::min(n, t0 + kTokenBlock);
    for (int64_t o0 = 0; o0 < rows; o0 += kRowBlock) {
      const int64_t num_rows = std::min(kRowBlock, rows - o0);
      const float* wb = wf + o0 * cols;
      int64_t t = t0;
      for (; t + 4 <= t1; t += 4) DotRows<4>(wb, num_rows, cols, x + t * cols, y + t * rows + o0, rows);
      switch (t1 - t) {
        case 3:
          DotRows<3>(wb, num_rows, cols, x + t * cols, y + t * rows + o0, rows);
          break;
        case 2:
          DotRows<2>(wb, num_rows, cols, x + t * cols, y + t * rows + o0, rows);
          break;
        case 1:
          DotRows<1>(wb, num_rows, cols, x + t * cols, y + t * rows + o0, rows);
          break;
        default:
          break;
      }
    }
  }
}

// The row-wise product ExpertFfnParams::batch_invariant asks for. MatMulT is batch-invariant for every n, so
// this is MatMulT (kept so that callers of the flag keep their meaning).
void MatMulTRowwise(const float* x, int64_t n, const WeightMatrix& w, float* y) { MatMulT(x, n, w, y); }

inline float Silu(float v) { return v / (1.f + std::exp(-v)); }

// h[n, I] = silu(x Wg^T) * (x Wu^T); y[n, H] = h Wd^T.
void SwiGlu(const float* x, int64_t n, const WeightMatrix& gate, const WeightMatrix& up, const WeightMatrix& down,
            float* y, bool rowwise = false) {
  const int64_t inter = gate.rows;
  thread_local std::vector<float> g, u;
  g.resize(static_cast<size_t>(n) * inter);
  u.resize(static_cast<size_t>(n) * inter);
  auto matmul = rowwise ? MatMulTRowwise : MatMulT;
  matmul(x, n, gate, g.data());
  matmul(x, n, up, u.data());
  for (size_t i = 0; i < g.size(); ++i) g[i] = Silu(g[i]) * u[i];
  matmul(g.data(), n, down, y);
}

}  // namespace

uint16_t FloatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // quiet NaN
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
    case DType::kI8:
      return "i8";
  }
  return "?";
}

float Bf16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

void RmsNorm(const RmsNormParams& p) {
  const int threads = ThreadsFor(static_cast<int64_t>(p.num_tokens) * p.hidden * 8);
  ParallelFor(
      p.num_tokens,
      [&](int64_t t) {
        const float* x = p.x + t * p.hidden;
        float* o = p.out + t * p.hidden;
        double ss = 0;
        for (int i = 0; i < p.hidden; ++i) ss += static_cast<double>(x[i]) * x[i];
        const float inv = static_cast<float>(1.0 / std::sqrt(ss / p.hidden + p.eps));
        for (int i = 0; i < p.hidden; ++i) o[i] = x[i] * inv * p.weight[i];
      },
      threads);
}

void ApplyRope(const RopeParams& p) {
  const int half = p.head_dim / 2;
  const int threads =
      ThreadsFor(static_cast<int64_t>(p.num_tokens) * (p.num_q_heads + p.num_kv_heads + 8) * p.head_dim * 8);
  ParallelFor(
      p.num_tokens,
      [&](int64_t t) {
        const double pos = p.positions[t];
        thread_local std::vector<float> cs, sn;
        cs.resize(half);
        sn.resize(half);
        for (int i = 0; i < half; ++i) {
          const double inv_freq = std::pow(static_cast<double>(p.theta), -2.0 * i / p.head_dim);
          cs[i] = static_cast<float>(std::cos(pos * inv_freq));
          sn[i] = static_cast<float>(std::sin(pos * inv_freq));
        }
        auto rotate = [&](float* v) {
          for (int i = 0; i < half; ++i) {
            const float a = v[i], b = v[i + half];
            v[i] = a * cs[i] - b * sn[i];
            v[i + half] = b * cs[i] + a * sn[i];
          }
        };
        for (int h = 0; h < p.num_q_heads; ++h) rotate(p.q + (t * p.num_q_heads + h) * p.head_dim);
        for (int h = 0; h < p.num_kv_heads; ++h) rotate(p.k + (t * p.num_kv_heads + h) * p.head_dim);
      },
      threads);
}

void Linear(const LinearParams& p) {
  // Split tokens across threads only when there are enough of them and the product is big; one GEMM otherwise.
  const int threads = p.num_tokens >= 64 ? ThreadsFor(p.num_tokens * p.weight.rows * p.weight.cols) : 1;
  const int64_t per = (p.num_tokens + threads - 1) / threads;
  ParallelFor(
      threads,
      [&](int64_t i) {
        const int64_t begin = i * per, end = std::min<int64_t>(p.num_tokens, begin + per);
        if (begin < end) MatMulT(p.x + begin * p.weight.cols, end - begin, p.weight, p.y + begin * p.weight.rows);
      },
      threads);
}

void GateTopK(const GateTopKParams& p) {
  ELDR_CHECK(p.top_k >= 1 && p.top_k <= p.num_experts, "top_k " << p.top_k << " out of range");
  const int threads = ThreadsFor(static_cast<int64_t>(p.num_tokens) * p.num_experts * 32);
  ParallelFor(
      p.num_tokens,
      [&](int64_t t) {
        const float* l = p.logits + t * p.num_experts;
        thread_local std::vector<double> prob;
        thread_local std::vector<int32_t> order;
        prob.resize(p.num_experts);
        order.resize(p.num_experts);
        const double mx = *std::max_element(l, l + p.num_experts);
        double sum = 0;
        for (int e = 0; e < p.num_experts; ++e) sum += prob[e] = std::exp(static_cast<double>(l[e]) - mx);
        for (int e = 0; e < p.num_experts; ++e) prob[e] /= sum;
        std::iota(order.begin(), order.end(), 0);
        std::partial_sort(order.begin(), order.begin() + p.top_k, order.end(),
                          [&](int32_t a, int32_t b) { return prob[a] > prob[b] || (prob[a] == prob[b] && a < b); });
        double kept = 0;
        for (int j = 0; j < p.top_k; ++j) kept += prob[order[j]];
        for (int j = 0; j < p.top_k; ++j) {
          p.topk_ids[t * p.top_k + j] = order[j];
          p.topk_weights[t * p.top_k + j] = static_cast<float>(p.renormalize ? prob[order[j]] / kept : prob[order[j]]);
        }
      },
      threads);
}

void GroupByExpert(const int32_t* topk_ids, int num_tokens, int top_k, int num_experts, ExpertGrouping* out) {
  const int n = num_tokens * top_k;
  out->offsets.assign(num_experts + 1, 0);
  for (int i = 0; i < n; ++i) {
    ELDR_CHECK(topk_ids[i] >= 0 && topk_ids[i] < num_experts, "expert id " << topk_ids[i] << " out of range");
    ++out->offsets[topk_ids[i] + 1];
  }
  out->active_experts.clear();
  for (int e = 0; e < num_experts; ++e) {
    if (out->offsets[e + 1] > 0) out->active_experts.push_back(e);
    out->offsets[e + 1] += out->offsets[e];
  }
  out->pairs.assign(n, 0);
  std::vector<int32_t> cursor(out->offsets.begin(), out->offsets.end() - 1);
  for (int i = 0; i < n; ++i) out->pairs[cursor[topk_ids[i]]++] = i;  // stable: ascending i within an expert
}

void MoeExperts(const MoeParams& p) {
  const ExpertWeights& w = *p.experts;
  const int H = w.hidden;
  ExpertGrouping g;
  GroupByExpert(p.topk_ids, p.num_tokens, p.top_k, w.num_experts, &g);
  // Each active expert computes its tokens' outputs into pair-indexed rows; then a per-token combine.
  std::vector<float> y(static_cast<size_t>(p.num_tokens) * p.top_k * H);
  const int threads = ThreadsFor(static_cast<int64_t>(g.active_experts.size()) * 3 * H * w.intermediate);
  ParallelFor(
      static_cast<int64_t>(g.active_experts.size()),
      [&](int64_t a) {
        const int e = g.active_experts[a];
        const int begin = g.offsets[e], count = g.offsets[e + 1] - begin;
        thread_local std::vector<float> xin, yout;
        xin.resize(static_cast<size_t>(count) * H);
        yout.resize(static_cast<size_t>(count) * H);
        for (int i = 0; i < count; ++i) {
          const int t = g.pairs[begin + i] / p.top_k;
          std::memcpy(xin.data() + static_cast<size_t>(i) * H, p.x + static_cast<size_t>(t) * H, H * sizeof(float));
        }
        ExpertFfn({xin.data(), count, &w, e, yout.data(), p.batch_invariant});
        for (int i = 0; i < count; ++i) {
          std::memcpy(y.data() + static_cast<size_t>(g.pairs[begin + i]) * H, yout.data() + static_cast<size_t>(i) * H,
                      H * sizeof(float));
        }
      },
      threads);
  MoeCombine({y.data(), p.topk_weights, p.num_tokens, p.top_k, H, p.out});
}

void ExpertFfn(const ExpertFfnParams& p) {
  const ExpertWeights& w = *p.experts;
  ELDR_CHECK(p.expert >= 0 && p.expert < w.num_experts, "expert id " << p.expert << " out of range");
  if (p.num_rows <= 0) return;
  SwiGlu(p.x, p.num_rows, w.gate_proj[p.expert], w.up_proj[p.expert], w.down_proj[p.expert], p.y, p.batch_invariant);
}

void MoeCombine(const MoeCombineParams& p) {
  const int H = p.hidden;
  ParallelFor(
      p.num_tokens,
      [&](int64_t t) {
        float* o = p.out + t * H;
        for (int j = 0; j < p.top_k; ++j) {
          const float wt = p.topk_weights[t * p.top_k + j];
          const float* src = p.y + (static_cast<size_t>(t) * p.top_k + j) * H;
          for (int i = 0; i < H; ++i) o[i] += wt * src[i];
        }
      },
      ThreadsFor(static_cast<int64_t>(p.num_tokens) * p.top_k * H * 4));
}

void Mlp(const MlpParams& p) {
  const int64_t H = p.down_proj.rows;
  std::vector<float> y(static_cast<size_t>(p.num_tokens) * H);
  const int threads = p.num_tokens >= 64 ? ThreadsFor(p.num_tokens * 3 * H * p.gate_proj.rows) : 1;
  const int64_t per = (p.num_tokens + threads - 1) / threads;
  ParallelFor(
      threads,
      [&](int64_t i) {
        const int64_t begin = i * per, end = std::min<int64_t>(p.num_tokens, begin + per);
        if (begin < end)
          SwiGlu(p.x + begin * H, end - begin, p.gate_proj, p.up_proj, p.down_proj, y.data() + begin * H);
      },
      threads);
  for (size_t i = 0; i < y.size(); ++i) p.out[i] += y[i];
}

namespace {

// The fp32 K and V of a CPU cache.
float* KeysF32(const PagedKv& c) {
  ELDR_CHECK(c.dtype == DType::kF32, "the CPU kernels keep KV in f32, not " << DTypeName(c.dtype));
  return static_cast<float*>(c.k);
}
float* ValuesF32(const PagedKv& c) {
  ELDR_CHECK(c.dtype == DType::kF32, "the CPU kernels keep KV in f32, not " << DTypeName(c.dtype));
  return static_cast<float*>(c.v);
}

void CheckSlot(const PagedKv& c, int64_t slot) {
  ELDR_CHECK(slot >= 0 && slot < static_cast<int64_t>(c.num_blocks) * c.block_size,
             "KV slot " << slot << " out of range (block " << (slot < 0 ? -1 : slot / c.block_size) << " of "
                        << c.num_blocks << ")");
}

}  // namespace

void WriteKv(const KvWriteParams& p) {
  const PagedKv& c = p.cache;
  const int64_t row = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  float* ck = KeysF32(c);
  float* cv = ValuesF32(c);
  for (int t = 0; t < p.num_tokens; ++t) {
    const int pos = p.positions[t];
    const int64_t block = p.block_table[pos / c.block_size];
    ELDR_CHECK(block >= 0 && block < c.num_blocks, "KV block " << block << " out of range");
    const int64_t slot = block * c.block_size + pos % c.block_size;
    std::memcpy(ck + slot * row, p.k + t * row, row * sizeof(float));
    std::memcpy(cv + slot * row, p.v + t * row, row * sizeof(float));
  }
}

void WriteKvSlots(const KvSlotWriteParams& p) {
  const PagedKv& c = p.cache;
  const int64_t row = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  float* ck = KeysF32(c);
  float* cv = ValuesF32(c);
  for (int t = 0; t < p.num_tokens; ++t) {
    const int64_t slot = p.slots[t];
    CheckSlot(c, slot);
    std::memcpy(ck + slot * row, p.k + t * row, row * sizeof(float));
    std::memcpy(cv + slot * row, p.v + t * row, row * sizeof(float));
  }
}

void PackKv(const KvPackParams& p) {
  const PagedKv& c = p.cache;
  const int64_t row = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  const float* src[2] = {KeysF32(c), ValuesF32(c)};
  float* packed = static_cast<float*>(p.packed);
  for (int kv = 0; kv < 2; ++kv) {
    float* dst = packed + static_cast<int64_t>(kv) * p.num_tokens * row;
    for (int t = 0; t < p.num_tokens; ++t) {
      CheckSlot(c, p.slots[t]);
      std::memcpy(dst + t * row, src[kv] + p.slots[t] * row, row * sizeof(float));
    }
  }
}

void UnpackKv(const KvPackParams& p) {
  const PagedKv& c = p.cache;
  const int64_t row = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  float* dst[2] = {KeysF32(c), ValuesF32(c)};
  const float* packed = static_cast<const float*>(p.packed);
  for (int kv = 0; kv < 2; ++kv) {
    const float* src = packed + static_cast<int64_t>(kv) * p.num_tokens * row;
    for (int t = 0; t < p.num_tokens; ++t) {
      CheckSlot(c, p.slots[t]);
      std::memcpy(dst[kv] + p.slots[t] * row, src + t * row, row * sizeof(float));
    }
  }
}

namespace {

// Softmax attention of one query head over context [0, len) of a sequence in the paged cache.
void AttendOne(const float* q, const PagedKv& c, const int32_t* block_table, int len, int kv_head, float scale,
               float* out, std::vector<float>* scores) {
  const int D = c.head_dim;
  const int64_t row = static_cast<int64_t>(c.num_kv_heads) * D;
  const float* ck = KeysF32(c);
  const float* cv = ValuesF32(c);
  scores->resize(len);
  float mx = -std::numeric_limits<float>::infinity();
  for (int pos = 0; pos < len; ++pos) {
    const int64_t slot = static_cast<int64_t>(block_table[pos / c.block_size]) * c.block_size + pos % c.block_size;
    const float* k = ck + slot * row + static_cast<int64_t>(kv_head) * D;
    float s = 0;
    for (int d = 0; d < D; ++d) s += q[d] * k[d];
    (*scores)[pos] = s * scale;
    mx = std::max(mx, (*scores)[pos]);
  }
  double sum = 0;
  for (int pos = 0; pos < len; ++pos) sum += (*scores)[pos] = std::exp((*scores)[pos] - mx);
  const float inv = static_cast<float>(1.0 / sum);
  std::fill(out, out + D, 0.f);
  for (int pos = 0; pos < len; ++pos) {
    const int64_t slot = static_cast<int64_t>(block_table[pos / c.block_size]) * c.block_size + pos % c.block_size;
    const float* v = cv + slot * row + static_cast<int64_t>(kv_head) * D;
    const float w = (*scores)[pos] * inv;
    for (int d = 0; d < D; ++d) out[d] += w * v[d];
  }
}

}  // namespace

void PagedAttentionDecode(const PagedAttentionDecodeParams& p) {
  const int group = p.num_q_heads / p.cache.num_kv_heads;
  const int D = p.cache.head_dim;
  int64_t work = 0;
  for (int s = 0; s < p.num_seqs; ++s) work += static_cast<int64_t>(p.context_lens[s]) * p.num_q_heads * D * 2;
  ParallelFor(
      static_cast<int64_t>(p.num_seqs) * p.num_q_heads,
      [&](int64_t i) {
        const int s = static_cast<int>(i / p.num_q_heads), h = static_cast<int>(i % p.num_q_heads);
        thread_local std::vector<float> scores;
        AttendOne(p.q + i * D, p.cache, p.block_tables + static_cast<int64_t>(s) * p.max_blocks_per_seq,
                  p.context_lens[s], h / group, p.scale, p.out + i * D, &scores);
      },
      ThreadsFor(work));
}

void PrefillAttention(const PrefillAttentionParams& p) {
  const int group = p.num_q_heads / p.cache.num_kv_heads;
  const int D = p.cache.head_dim;
  const int64_t work = static_cast<int64_t>(p.num_tokens) * (p.start + p.num_tokens) * p.num_q_heads * D;
  ParallelFor(
      static_cast<int64_t>(p.num_tokens) * p.num_q_heads,
      [&](int64_t i) {
        const int t = static_cast<int>(i / p.num_q_heads), h = static_cast<int>(i % p.num_q_heads);
        thread_local std::vector<float> scores;
        AttendOne(p.q + i * D, p.cache, p.block_table, p.start + t + 1, h / group, p.scale, p.out + i * D, &scores);
      },
      ThreadsFor(work));
}

void EmbeddingGather(const EmbeddingGatherParams& p) {
  const WeightMatrix& table = p.table;
  const int64_t H = table.cols;
  for (int t = 0; t < p.num_tokens; ++t) {
    const int32_t token = p.tokens[t];
    ELDR_CHECK(token >= 0 && token < table.rows, "token id " << token << " outside the vocabulary");
    float* out = p.out + t * H;
    if (table.dtype == DType::kF32) {
      std::memcpy(out, static_cast<const float*>(table.data) + token * H, H * sizeof(float));
    } else {
      ELDR_CHECK(table.dtype == DType::kBF16, "embedding table of " << DTypeName(table.dtype));
      const uint16_t* row = static_cast<const uint16_t*>(table.data) + token * H;
      for (int64_t h = 0; h < H; ++h) out[h] = Bf16ToFloat(row[h]);
    }
  }
}

void ResidualAdd(const ResidualAddParams& p) {
  for (int64_t i = 0; i < p.n; ++i) p.out[i] += p.x[i];
}

void ArgMax(const ArgMaxParams& p) {
  for (int r = 0; r < p.num_rows; ++r) {
    const float* x = p.x + static_cast<int64_t>(r) * p.num_cols;
    p.out[r] = static_cast<int32_t>(std::max_element(x, x + p.num_cols) - x);
  }
}

void ReplayTopK(const ReplayTopKParams& p) {
  const int E = p.num_experts, K = p.top_k;
  for (int t = 0; t < p.num_tokens; ++t) {
    if (p.mode[t] == kReplayKeep) continue;
    const bool given = p.mode[t] == kReplayIdsAndWeights;
    const int32_t* ids = p.replay_ids + static_cast<size_t>(t) * K;
    const float* lg = p.logits + static_cast<size_t>(t) * E;
    const float mx = *std::max_element(lg, lg + E);
    double z = 0;
    for (int e = 0; e < E; ++e) z += std::exp(static_cast<double>(lg[e] - mx));
    double kept = 0;
    for (int j = 0; j < K; ++j) {
      ELDR_CHECK(ids[j] >= 0 && ids[j] < E, "replayed expert id " << ids[j] << " out of range");
      p.topk_ids[t * K + j] = ids[j];
      const double prob =
          given ? p.replay_weights[static_cast<size_t>(t) * K + j] : std::exp(static_cast<double>(lg[ids[j]] - mx)) / z;
      p.topk_weights[t * K + j] = static_cast<float>(prob);
      kept += prob;
    }
    if (!given && p.renormalize && kept > 0) {
      for (int j = 0; j < K; ++j) p.topk_weights[t * K + j] = static_cast<float>(p.topk_weights[t * K + j] / kept);
    }
  }
}

void AccumulateSignatureCounts(const SignatureCountParams& p) {
  for (int t = 0; t < p.num_tokens; ++t) {
    int8_t* r = p.rows + static_cast<int64_t>(t / p.block_size) * p.row_stride;
    for (int j = 0; j < p.top_k; ++j) ++r[p.topk_ids[t * p.top_k + j]];
  }
}

}  // namespace eldr::kernels
