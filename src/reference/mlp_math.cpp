#include "reference/mlp_math.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "mok/formats.hpp"

namespace mok::ref {
namespace {

std::vector<float> to_float(const double* v, int64_t n) {
  std::vector<float> f(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) f[size_t(i)] = float(v[i]);
  return f;
}

void from_float(const std::vector<float>& f, double* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) v[i] = double(f[size_t(i)]);
}

// Quantize-dequantize a [rows, cols] FP32 matrix with the given block; the scale rules are the
// ones of the quantizers in src/formats (formats.md).
std::vector<float> quant_dequant(const Rounding& r, const std::vector<float>& m, int64_t rows,
                                 int64_t cols, BlockShape block) {
  switch (r.quant) {
    case OperandQuant::fp8_block:
      return dequantize(quantize_fp8_block(m.data(), rows, cols, block, r.fp8_ue8m0));
    case OperandQuant::mxfp8:
      return dequantize(quantize_mxfp8(m.data(), rows, cols, block, r.mx_scale_rule));
    case OperandQuant::nvfp4:
    case OperandQuant::nvfp4_weights:
      return dequantize(quantize_nvfp4(m.data(), rows, cols, block));
    case OperandQuant::none:
    case OperandQuant::bf16:
      break;
  }
  return m;
}

double sigmoid(double g) { return 1.0 / (1.0 + std::exp(-g)); }

double dot(const double* a, const double* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

void Rounding::quantize_row(double* v, int64_t n) const {
  if (quant == OperandQuant::none) {
    for (int64_t i = 0; i < n; ++i) v[i] = store(v[i]);
    return;
  }
  if (quant == OperandQuant::bf16 || quant == OperandQuant::nvfp4_weights) {
    for (int64_t i = 0; i < n; ++i) v[i] = fmt::round_to_bf16(float(v[i]));
    return;
  }
  // NVFP4 packs two elements per byte: an odd row gets one zero, which changes no amax.
  const int64_t padded = quant == OperandQuant::nvfp4 ? n + (n & 1) : n;
  std::vector<float> f(size_t(padded), 0.0f);
  for (int64_t i = 0; i < n; ++i) f[size_t(i)] = float(v[i]);
  const BlockShape block = quant == OperandQuant::fp8_block ? BlockShape{1, 128}
                           : quant == OperandQuant::mxfp8   ? BlockShape{1, 32}
                                                            : BlockShape{1, 16};
  from_float(quant_dequant(*this, f, 1, padded, block), v, n);
}

void Rounding::quantize_weight(double* w, int64_t rows, int64_t cols,
                               bool contract_over_cols) const {
  if (quant == OperandQuant::none || quant == OperandQuant::bf16) {
    quantize_row(w, rows * cols);  // element-wise
    return;
  }
  BlockShape block{128, 128};  // FP8 block: square, so one copy serves both directions
  if (quant == OperandQuant::mxfp8)
    block = contract_over_cols ? BlockShape{1, 32} : BlockShape{32, 1};
  if (quant == OperandQuant::nvfp4 || quant == OperandQuant::nvfp4_weights)
    block = {16, 16};  // square as well
  from_float(quant_dequant(*this, to_float(w, rows * cols), rows, cols, block), w, rows * cols);
}

void Rounding::quantize_tile_columns(double* tile, int64_t rows, int64_t cols) const {
  if (quant == OperandQuant::none || quant == OperandQuant::bf16 ||
      quant == OperandQuant::nvfp4_weights) {
    quantize_row(tile, rows * cols);
    return;
  }
  std::vector<double> column(static_cast<size_t>(rows));
  for (int64_t c = 0; c < cols; ++c) {
    for (int64_t i = 0; i < rows; ++i) column[size_t(i)] = tile[i * cols + c];
    quantize_row(column.data(), rows);
    for (int64_t i = 0; i < rows; ++i) tile[i * cols + c] = column[size_t(i)];
  }
}

PreparedMlp prepare_mlp(const double* gate, const double* up, const double* down, int64_t hidden,
                        int64_t width, const Rounding& r) {
  PreparedMlp m;
  m.hidden = hidden;
  m.width = width;
  const size_t n = size_t(hidden * width);
  m.gate_fwd.assign(gate, gate + n);
  m.up_fwd.assign(up, up + n);
  m.down_fwd.assign(down, down + n);
  m.gate_bwd = m.gate_fwd;
  m.up_bwd = m.up_fwd;
  m.down_bwd = m.down_fwd;
  // NVFP4 takes gate and up as one [2 width, H] matrix, as a fused w13 is: one per-tensor factor
  // for both, so a GEMM contracting over both (the backward's dgrad) has one.
  const bool fused = r.quant == OperandQuant::nvfp4 || r.quant == OperandQuant::nvfp4_weights;
  for (const bool contract_over_cols : {true, false}) {
    std::vector<double>& g = contract_over_cols ? m.gate_fwd : m.gate_bwd;
    std::vector<double>& u = contract_over_cols ? m.up_fwd : m.up_bwd;
    if (fused) {
      std::vector<double> both(g);
      both.insert(both.end(), u.begin(), u.end());
      r.quantize_weight(both.data(), 2 * width, hidden, contract_over_cols);
      std::copy(both.begin(), both.begin() + std::ptrdiff_t(n), g.begin());
      std::copy(both.begin() + std::ptrdiff_t(n), both.end(), u.begin());
    } else {
      r.quantize_weight(g.data(), width, hidden, contract_over_cols);
      r.quantize_weight(u.data(), width, hidden, contract_over_cols);
    }
    r.quantize_weight((contract_over_cols ? m.down_fwd : m.down_bwd).data(), hidden, width,
                      contract_over_cols);
  }
  return m;
}

void mlp_row_forward(const PreparedMlp& m, const double* x, const Rounding& r, RowForward& out) {
  const int64_t H = m.hidden, W = m.width;
  std::vector<double> xq(x, x + H);
  r.quantize_row(xq.data(), H);
  out.g.resize(size_t(W));
  out.u.resize(size_t(W));
  out.a.resize(size_t(W));
  out.y.resize(size_t(H));
  for (int64_t i = 0; i < W; ++i) {
    out.g[size_t(i)] = r.store(dot(&m.gate_fwd[size_t(i * H)], xq.data(), H));
    out.u[size_t(i)] = r.store(dot(&m.up_fwd[size_t(i * H)], xq.data(), H));
    const double g = out.g[size_t(i)];
    out.a[size_t(i)] = r.store(g * sigmoid(g) * out.u[size_t(i)]);
  }
  out.aq = out.a;
  r.quantize_row(out.aq.data(), W);
  for (int64_t h = 0; h < H; ++h)
    out.y[size_t(h)] = r.store(dot(&m.down_fwd[size_t(h * W)], out.aq.data(), W));
}

void mlp_row_backward(const PreparedMlp& m, const double* x, const double* d_out, double weight,
                      const Rounding& r, RowBackward& out) {
  const int64_t H = m.hidden, W = m.width;
  mlp_row_forward(m, x, r, out.fwd);
  std::vector<double> dout(d_out, d_out + H);
  for (double& v : dout) v = r.store(v);
  out.dy.resize(size_t(H));
  for (int64_t h = 0; h < H; ++h) out.dy[size_t(h)] = r.store(weight * dout[size_t(h)]);

  // fp8_block's and mxfp8's dgrad GEMM reads d_out unweighted; its FP32 accumulator
  // da' = down^T q(d_out) gives the routing weight's gradient <da', aq> without y, and
  // da = weight * da'.
  const bool unweighted = r.dgrad_only();
  std::vector<double> dq = unweighted ? dout : out.dy;
  r.quantize_row(dq.data(), H);

  // da = down^T dq, summed over h in ascending order for every i, then stored.
  std::vector<double> da(size_t(W), 0.0);
  for (int64_t h = 0; h < H; ++h) {
    const double* row = &m.down_bwd[size_t(h * W)];
    for (int64_t i = 0; i < W; ++i) da[size_t(i)] += row[i] * dq[size_t(h)];
  }
  for (double& v : da) v = r.store(v);
  if (unweighted) {
    out.d_weight = r.store(dot(da.data(), out.fwd.aq.data(), W));
    for (double& v : da) v = r.store(weight * v);
    out.down_a = dout;
    out.down_b.resize(size_t(W));
    for (int64_t i = 0; i < W; ++i) out.down_b[size_t(i)] = r.store(weight * out.fwd.aq[size_t(i)]);
  } else {
    out.d_weight = r.store(dot(dout.data(), out.fwd.y.data(), H));
    out.down_a = out.dy;
    out.down_b = out.fwd.a;
  }
  // These recipes' forwards keep g and u in BF16 (their contexts), and the SwiGLU backward reads
  // those: before E4M3 quantization of dg | du, FP32 ones would flip ~2% of the codes.
  auto kept = [&](double v) { return unweighted ? double(fmt::round_to_bf16(float(v))) : v; };
  out.dg.resize(size_t(W));
  out.du.resize(size_t(W));
  for (int64_t i = 0; i < W; ++i) {
    const double a = da[size_t(i)], g = kept(out.fwd.g[size_t(i)]), s = sigmoid(g);
    out.dg[size_t(i)] = r.store(a * kept(out.fwd.u[size_t(i)]) * s * (1.0 + g * (1.0 - s)));
    out.du[size_t(i)] = r.store(a * g * s);
  }
  // fp8_block quantizes dg | du as stored in BF16 (the weight gradients' operands), mxfp8 its
  // FP32 values.
  std::vector<double> dgq = out.dg, duq = out.du;
  if (r.quant == OperandQuant::fp8_block)
    for (std::vector<double>* v : {&dgq, &duq})
      for (double& e : *v) e = double(fmt::round_to_bf16(float(e)));
  r.quantize_row(dgq.data(), W);
  r.quantize_row(duq.data(), W);

  // dx = gate^T dg + up^T du: one sum per h over the gate rows, then the up rows.
  std::vector<double> dx(size_t(H), 0.0);
  for (int64_t i = 0; i < W; ++i) {
    const double* row = &m.gate_bwd[size_t(i * H)];
    for (int64_t h = 0; h < H; ++h) dx[size_t(h)] += row[h] * dgq[size_t(i)];
  }
  for (int64_t i = 0; i < W; ++i) {
    const double* row = &m.up_bwd[size_t(i * H)];
    for (int64_t h = 0; h < H; ++h) dx[size_t(h)] += row[h] * duq[size_t(i)];
  }
  out.dx.resize(size_t(H));
  for (int64_t h = 0; h < H; ++h) out.dx[size_t(h)] = r.store(dx[size_t(h)]);
}

MlpGradAccumulator::MlpGradAccumulator(int64_t hidden, int64_t width)
    : hidden_(hidden),
      width_(width),
      gate_(size_t(hidden * width), 0.0),
      up_(size_t(hidden * width), 0.0),
      down_(size_t(hidden * width), 0.0) {}

void MlpGradAccumulator::add_tile(const RowBackward* const* rows, const double* const* x_rows,
                                  int64_t n, const Rounding& r) {
  const int64_t H = hidden_, W = width_;
  std::vector<double> x(size_t(n * H)), dy(size_t(n * H)), a(size_t(n * W)), dg(size_t(n * W)),
      du(size_t(n * W));
  for (int64_t j = 0; j < n; ++j) {
    std::copy(x_rows[j], x_rows[j] + H, &x[size_t(j * H)]);
    std::copy(rows[j]->down_a.begin(), rows[j]->down_a.end(), &dy[size_t(j * H)]);
    std::copy(rows[j]->down_b.begin(), rows[j]->down_b.end(), &a[size_t(j * W)]);
    std::copy(rows[j]->dg.begin(), rows[j]->dg.end(), &dg[size_t(j * W)]);
    std::copy(rows[j]->du.begin(), rows[j]->du.end(), &du[size_t(j * W)]);
  }
  const Rounding wr = r.for_wgrad();
  for (std::vector<double>* t : {&x, &dy}) wr.quantize_tile_columns(t->data(), n, H);
  for (std::vector<double>* t : {&a, &dg, &du}) wr.quantize_tile_columns(t->data(), n, W);
  for (int64_t j = 0; j < n; ++j) {
    const double* xr = &x[size_t(j * H)];
    const double* dyr = &dy[size_t(j * H)];
    for (int64_t i = 0; i < W; ++i) {
      const double g = dg[size_t(j * W + i)], u = du[size_t(j * W + i)];
      double* gate_row = &gate_[size_t(i * H)];
      double* up_row = &up_[size_t(i * H)];
      for (int64_t h = 0; h < H; ++h) {
        gate_row[h] += g * xr[h];
        up_row[h] += u * xr[h];
      }
    }
    for (int64_t h = 0; h < H; ++h) {
      double* down_row = &down_[size_t(h * W)];
      const double d = dyr[h];
      for (int64_t i = 0; i < W; ++i) down_row[i] += d * a[size_t(j * W + i)];
    }
  }
}

void MlpGradAccumulator::finish(const Rounding& r, double* d_gate, double* d_up,
                                double* d_down) const {
  for (size_t i = 0; i < gate_.size(); ++i) {
    d_gate[i] = r.store(gate_[i]);
    d_up[i] = r.store(up_[i]);
    d_down[i] = r.store(down_[i]);
  }
}

}  // namespace mok::ref
