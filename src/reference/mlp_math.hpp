// The SwiGLU MLP of one expert (or of the shared experts) one routed row at a time, and its weight
// gradients one tile of rows at a time. The CPU reference and the EP simulation both call these,
// so their results agree bit for bit whenever they feed the same rows in the same order.
#pragma once
#include <cstdint>
#include <vector>

#include "mok/layer.hpp"

namespace mok::ref {

// Storage rounding (Numerics) and GEMM-operand quantization (OperandQuant) of one run.
struct Rounding {
  Numerics numerics = Numerics::fp32;
  OperandQuant quant = OperandQuant::none;
  MxScaleRule mx_scale_rule = MxScaleRule::rceil;
  bool fp8_ue8m0 = false;

  static Rounding from(const ReferenceOptions& o) {
    return {o.numerics, o.quant, o.mx_scale_rule, o.fp8_ue8m0};
  }
  // The shared experts stay BF16 in every low-precision recipe (as in Mixture-of-Kittens).
  Rounding for_shared() const {
    Rounding r = *this;
    if (quant != OperandQuant::none) r.quant = OperandQuant::bf16;
    return r;
  }
  // fp8_block and mxfp8 quantize the dgrad GEMMs' operands only (SonicMoE's recipe): the
  // weight-gradient GEMMs take BF16 operands, and the dgrad-down GEMM reads d_out unweighted
  // (mlp_row_backward). NVFP4 keeps its own blocks along tokens.
  bool dgrad_only() const {
    return quant == OperandQuant::fp8_block || quant == OperandQuant::mxfp8;
  }
  // The weight-gradient GEMMs' operands (above).
  Rounding for_wgrad() const {
    Rounding r = *this;
    if (dgrad_only()) r.quant = OperandQuant::bf16;
    return r;
  }

  double store(double v) const { return numerics == Numerics::fp32 ? double(float(v)) : v; }
  // One K-major operand row of an activation or gradient: blocks run along the row.
  void quantize_row(double* v, int64_t n) const;
  // A weight [rows, cols]; blocks along cols when the GEMM contracts over cols, else along rows.
  void quantize_weight(double* w, int64_t rows, int64_t cols, bool contract_over_cols) const;
  // A weight-gradient operand tile [rows, cols] (rows = tokens): blocks run down the columns.
  void quantize_tile_columns(double* tile, int64_t rows, int64_t cols) const;
};

// An MLP's weights as each GEMM sees them (quantized, dequantized, FP64).
struct PreparedMlp {
  int64_t hidden = 0, width = 0;         // H and the intermediate width
  std::vector<double> gate_fwd, up_fwd;  // [width, H], contracted over H
  std::vector<double> down_fwd;          // [H, width], contracted over width
  std::vector<double> gate_bwd, up_bwd;  // [width, H], contracted over width (dgrad of x)
  std::vector<double> down_bwd;          // [H, width], contracted over H (dgrad of a)
};

PreparedMlp prepare_mlp(const double* gate, const double* up, const double* down, int64_t hidden,
                        int64_t width, const Rounding& r);

struct RowForward {
  std::vector<double> g, u, a;  // [width]: gate and up projections, silu(g) * u
  std::vector<double> aq;       // [width]: a quantized-dequantized, the down GEMM's operand
  std::vector<double> y;        // [H]
};

// y = down * (silu(gate * x) .* (up * x)) for one row x [H].
void mlp_row_forward(const PreparedMlp& m, const double* x, const Rounding& r, RowForward& out);

struct RowBackward {
  RowForward fwd;              // recomputed forward
  std::vector<double> dy;      // [H]     weight * d_out, the gradient reaching y
  std::vector<double> dg, du;  // [width]
  std::vector<double> dx;      // [H]
  double d_weight = 0;         // the gradient of the routing weight
  // This row's operands of d_down = sum over rows down_a^T down_b, before their rounding along
  // tokens: dy [H] and a [width]; dgrad_only recipes: d_out [H] (unweighted) and weight * aq.
  std::vector<double> down_a, down_b;
};

// Backward of `weight * mlp(x)` for one row, given d_out [H]. bf16, nvfp4 and none:
// d_weight = <d_out, y>, and da = down^T q(weight * d_out). fp8_block and mxfp8
// (Rounding::dgrad_only, as the GPU computes them): da' = down^T q(d_out) (d_out unweighted, in
// the recipe's blocks along H), d_weight = <da', aq>, da = weight * da'.
void mlp_row_backward(const PreparedMlp& m, const double* x, const double* d_out, double weight,
                      const Rounding& r, RowBackward& out);

// Weight gradients summed over rows in a fixed order, one tile of rows at a time (the tile is the
// block the wgrad operands are quantized over along tokens; Rounding::for_wgrad's blocks).
class MlpGradAccumulator {
 public:
  MlpGradAccumulator(int64_t hidden, int64_t width);
  // rows[i] and x_rows[i] (each [H]) describe row i of the tile; n <= tile rows.
  void add_tile(const RowBackward* const* rows, const double* const* x_rows, int64_t n,
                const Rounding& r);
  // Rounded to storage: d_gate, d_up [width, H], d_down [H, width].
  void finish(const Rounding& r, double* d_gate, double* d_up, double* d_down) const;

 private:
  int64_t hidden_, width_;
  std::vector<double> gate_, up_, down_;
};

}  // namespace mok::ref
