// The router's centroid matrix (DESIGN.md §3 "Band routing", "Marginal-cost routing"): the K centroids μ_k of
// the calibration, held as 16-bit fixed point, and the K products s·μ̂_k every signature decision starts from.
//
// Why 16-bit integers: at K = 40 decoders and 48 masked layers of 128 experts the float matrix is 983 KB, which does
// not stay in a 2 MiB L2 beside the predicted unions the default decision also reads (issue 15). Half the bytes as
// bfloat16 (stop 32) still paid a widening per entry in the vector units; 16-bit integers are multiplied and
// accumulated by one instruction (AVX-512 VNNI `vpdpwssd`) per 32 entries, exactly, in any order.
//
// Definition (every build gives the same bits; tests/unit/centroid_reference.h re-derives it):
//   row k:  n_k = ‖μ_k‖₂ (double, ascending x), w_k,x = nearbyint(μ_k,x · (32767 / n_k)) in double, clamped to
//           ±32767 (all 0 when n_k = 0), and the row's step r_k = n_k / 32767;
//   s:      σ = Σ s_x² in float, entry x < 64·⌊D/64⌋ fused-multiply-added into lane x mod 64 of 64 float lanes that
//           start at 0, the lanes summed in ascending order from 0, then the D mod 64 tail entries fused-multiply-added
//           in ascending order; a = 32767 / sqrt(σ) in float; q_x = nearbyint(s_x · a) (the product in float, ties to
//           even), clamped to ±32767;
//   out[k] = float((double(A_k) · r_k) / a), A_k = Σ_x q_x·w_k,x, exact in integers: |A_k| ≤ ‖q‖·‖w_k‖ < 2^31
//           (Cauchy-Schwarz, each factor ≤ 32767 + √D/2), and so is every partial sum, whatever the order.
//   σ = 0 gives out = 0; a non-finite σ gives out = NaN.
// Error: ŝ = q/a and μ̂_k = r_k·w_k differ from s and μ_k by at most 0.5/a (+ the float product's 2^-24 relative) and
// 0.5·r_k per entry, so |out[k] − s·μ_k| ≤ (0.51/a)·‖μ̂_k‖₁ + 0.5·r_k·‖s‖₁ + 2^-24·|out[k]|: for unit-norm s and μ_k
// at most ≈ (‖s‖₁ + ‖μ_k‖₁)/65534 ≤ √D/32767, 0.0024 at D = 6144 (bfloat16's bound was 2^-8·s·μ_k ≤ 0.0039), and
// the rounding errors' signs vary, so a real product moves by ~10^-5 (centroid_matrix_test records it).
// Thread safety: Dots is const and reentrant (the caller owns the scratch).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/common/huge_pages.h"

namespace eldr {

class CentroidMatrix {
 public:
  CentroidMatrix() = default;
  // centroids [num_rows, dim] row-major (the calibration's /clusters/centroids). REQUIRES: size = num_rows · dim,
  // finite entries.
  CentroidMatrix(const std::vector<float>& centroids, int num_rows, int dim);

  // out[k] = ŝ·μ̂_k as the header defines it. s: [dim], out: [num_rows]; scratch is resized to dim (the quantised s).
  // Reads num_rows · dim · 2 bytes of centroids.
  void Dots(const float* s, float* out, std::vector<int16_t>* scratch) const;

  // μ̂_k,x = r_k · w_k,x as a double.
  double value(int k, int x) const;
  int num_rows() const { return num_rows_; }
  int dim() const { return dim_; }
  size_t bytes() const { return rows_.size() * sizeof(int16_t); }

 private:
  int num_rows_ = 0, dim_ = 0;
  HugePageVector<int16_t> rows_;  // [num_rows, dim] w_k,x, row-major
  std::vector<double> steps_;     // [num_rows] r_k
};

}  // namespace eldr
