// How results are compared with the oracle: norm-wise relative error, and the bound each operand
// precision is held to against the unquantized FP64 reference (docs/recipes.md says why).
#pragma once
#include <cmath>
#include <vector>

#include "mok/layer.hpp"

namespace mok {

// ||a - b||_2 / ||b||_2 (0 when both are zero; Inf on a size mismatch or a NaN).
inline double relative_l2_error(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  if (std::isnan(num)) return INFINITY;
  if (den == 0) return num == 0 ? 0.0 : INFINITY;
  return std::sqrt(num / den);
}

// Relative L2 bound of a whole-layer result (forward or any gradient) against FP64.
inline double relative_error_bound(OperandQuant q) {
  switch (q) {
    // A gradient passes through up to four rounded operands in a row (dy, da -> dg, x, and the
    // stored result); uniform rounding error has RMS step/sqrt(12), step = 2^-p relative.
    case OperandQuant::none:
      return 1e-5;  // FP32: 2^-24 steps; ~1e-7 expected
    case OperandQuant::bf16:
      return 1.5e-2;  // 2^-8 steps: ~2e-3 expected
    case OperandQuant::fp8_block:
      return 0.12;  // E4M3, 2^-3 steps: ~7% expected
    case OperandQuant::mxfp8:
      return 0.12;
    case OperandQuant::nvfp4:
      return 0.5;  // E2M1, 2^-1 steps (scaled): ~28% expected
    case OperandQuant::nvfp4_weights:
      return 0.5;  // the weights' E2M1 rounding alone: 9e-2 to 0.2 measured on tiny (recipes.md)
  }
  return 0;
}

}  // namespace mok
