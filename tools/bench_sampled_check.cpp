#include "bench_sampled_check.hpp"

#include <cstring>

#include "mok/compare.hpp"
#include "mok/formats/codecs.hpp"
#include "reference/layer_sums.hpp"
#include "reference/mlp_math.hpp"

namespace mok::tools {

namespace {

std::vector<double> bf16_values(const __nv_bfloat16* from, int64_t first, int64_t n) {
  std::vector<uint16_t> bits(static_cast<size_t>(n));
  cuda_ok(cudaMemcpy(bits.data(), from + first, size_t(n) * 2, cudaMemcpyDeviceToHost),
          "cudaMemcpy");
  std::vector<double> v(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) v[i] = fmt::bf16_to_float(bits[i]);
  return v;
}

// The forward operands of one MLP as the reference's row math reads them. The values are BF16
// already, which the reference's BF16 operand rounding leaves as they are; the backward's
// copies stay empty (only mlp_row_forward runs).
ref::PreparedMlp forward_mlp(const __nv_bfloat16* gate, const __nv_bfloat16* up,
                             const __nv_bfloat16* down, int64_t first, int64_t hidden,
                             int64_t width) {
  ref::PreparedMlp m;
  m.hidden = hidden;
  m.width = width;
  m.gate_fwd = bf16_values(gate, first, width * hidden);
  m.up_fwd = bf16_values(up, first, width * hidden);
  m.down_fwd = bf16_values(down, first, hidden * width);
  return m;
}

}  // namespace

double sampled_reference_error(const Config& c, const BenchLayer& data) {
  const int64_t T = data.tokens, H = c.hidden, I = c.intermediate, S = c.shared_width(),
                K = c.top_k;
  if (T == 0) return 0;
  std::vector<int64_t> picks{0};
  if (T / 2 > 0) picks.push_back(T / 2);
  if (T - 1 > T / 2) picks.push_back(T - 1);
  ref::Rounding r;
  r.numerics = Numerics::fp32;
  r.quant = OperandQuant::bf16;
  const ref::Rounding shared_r = r.for_shared();
  ref::PreparedMlp shared;
  if (S > 0) shared = forward_mlp(data.sg.ptr, data.su.ptr, data.sd.ptr, 0, H, S);
  std::vector<double> got, want;
  for (const int64_t t : picks) {
    const std::vector<double> x = bf16_values(data.x.ptr, t * H, H);
    std::vector<int32_t> ids(static_cast<size_t>(K));
    std::vector<float> w(static_cast<size_t>(K));
    cuda_ok(cudaMemcpy(ids.data(), data.ids.ptr + t * K, size_t(K) * 4, cudaMemcpyDeviceToHost),
            "cudaMemcpy");
    cuda_ok(cudaMemcpy(w.data(), data.w.ptr + t * K, size_t(K) * 4, cudaMemcpyDeviceToHost),
            "cudaMemcpy");
    std::vector<double> y_shared(static_cast<size_t>(H), 0.0), y_slots(static_cast<size_t>(K * H)),
        weights(w.begin(), w.end());
    ref::RowForward row;
    if (S > 0) {
      ref::mlp_row_forward(shared, x.data(), shared_r, row);
      y_shared = row.y;
    }
    for (int64_t k = 0; k < K; ++k) {  // one expert's weights on the host at a time
      const int64_t e = ids[size_t(k)];
      const ref::PreparedMlp m = forward_mlp(data.g.ptr, data.u.ptr, data.d.ptr, e * I * H, H, I);
      ref::mlp_row_forward(m, x.data(), r, row);
      std::memcpy(&y_slots[size_t(k * H)], row.y.data(), size_t(H) * sizeof(double));
    }
    std::vector<double> out(static_cast<size_t>(H));
    ref::combine_rows(r, 1, H, K, y_shared.data(), y_slots.data(), weights.data(), out.data());
    want.insert(want.end(), out.begin(), out.end());
    const std::vector<double> mine = bf16_values(data.out.ptr, t * H, H);
    got.insert(got.end(), mine.begin(), mine.end());
  }
  return relative_l2_error(got, want);
}

}  // namespace mok::tools
