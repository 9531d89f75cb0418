// The router's centroid matrix (DESIGN.md §3 "Band routing", "Marginal-cost routing"): the K centroids μ_k of
// the calibration, held rounded to bfloat16, and the K products s·μ̂_k every signature decision starts from.
//
// Why bfloat16: at K = 40 decoders and 48 masked layers of 128 experts the float matrix is 983 KB, which does not
// stay in a 2 MiB L2 beside the predicted unions the default decision also reads; the product then streams from
// L3 (issue 15). Rounded to bfloat16 (round to nearest even, 8 significant bits) it is half that.
// The rounding moves a distance by at most 2^-8 · Σ_x |s_x|·|μ_k,x| (the unit roundoff of 8 significant bits),
// which for the unit-norm, non-negative signatures and centroids of count·idf is 2^-8 · s·μ_k ≤ 0.004, against a
// band width τ of 0.1
// (bench/README "Routing at any mask" measures how many decisions of the real trace it changes).
// The product is float arithmetic on the rounded values (a bfloat16 widens to float without error), summed in the
// order below.
//
// Summation order (fixed, the same on every build; tests/unit/centroid_matrix_test.cc re-derives it): entry
// 32c + j of a row (j < 32, chunks c in ascending order) is fused-multiply-added into lane j of 32 float lanes that
// start at 0; the dot is Σ_{i=0..15} (lane_i + lane_{16+i}) summed in ascending i from 0, plus the dim mod 32 tail
// entries fused-multiply-added in ascending order into a scalar that starts at 0 (the tail added last).
// Thread safety: Dots is const and reentrant.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace eldr {

class CentroidMatrix {
 public:
  CentroidMatrix() = default;
  // centroids [num_rows, dim] row-major (the calibration's /clusters/centroids). REQUIRES: size = num_rows · dim.
  CentroidMatrix(const std::vector<float>& centroids, int num_rows, int dim);

  // out[k] = s·μ̂_k in the order above. s: [dim], out: [num_rows]. Reads num_rows · dim · 2 bytes.
  void Dots(const float* s, float* out) const;

  // μ̂_k,x as a float.
  float value(int k, int x) const;
  int num_rows() const { return num_rows_; }
  int dim() const { return dim_; }
  size_t bytes() const { return rows_.size() * sizeof(uint16_t); }

  // Round to nearest even (finite inputs), and the exact widening back.
  static uint16_t RoundToBf16(float x);
  static float Bf16ToFloat(uint16_t b);

 private:
  int num_rows_ = 0, dim_ = 0;
  std::vector<uint16_t> rows_;  // [num_rows, dim] bfloat16 bits, each row stored as centroid_matrix.cc says
};

}  // namespace eldr
