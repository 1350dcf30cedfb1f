#include "bench_sampled_check.hpp"

#if defined(MOK_WITH_CUDA_KERNELS)

#include <algorithm>
#include <cstddef>

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
  const size_t P = picks.size();
  ref::Rounding r;
  r.numerics = Numerics::fp32;
  r.quant = OperandQuant::bf16;
  const ref::Rounding shared_r = r.for_shared();
  std::vector<std::vector<double>> x(P);
  std::vector<int32_t> ids(P * size_t(K));
  std::vector<double> weights(P * size_t(K)), y_shared(P * size_t(H), 0.0),
      y_slots(P * size_t(K * H));
  for (size_t p = 0; p < P; ++p) {
    x[p] = bf16_values(data.x.ptr, picks[p] * H, H);
    std::vector<float> w(static_cast<size_t>(K));
    cuda_ok(cudaMemcpy(&ids[p * size_t(K)], data.ids.ptr + picks[p] * K, size_t(K) * 4,
                       cudaMemcpyDeviceToHost),
            "cudaMemcpy");
    cuda_ok(cudaMemcpy(w.data(), data.w.ptr + picks[p] * K, size_t(K) * 4, cudaMemcpyDeviceToHost),
            "cudaMemcpy");
    std::copy(w.begin(), w.end(), weights.begin() + std::ptrdiff_t(p * size_t(K)));
  }
  ref::RowForward row;
  if (S > 0) {
    const ref::PreparedMlp shared = forward_mlp(data.sg.ptr, data.su.ptr, data.sd.ptr, 0, H, S);
    for (size_t p = 0; p < P; ++p) {
      ref::mlp_row_forward(shared, x[p].data(), shared_r, row);
      std::copy(row.y.begin(), row.y.end(), y_shared.begin() + std::ptrdiff_t(p * size_t(H)));
    }
  }
  // Each expert the sampled tokens use, once: its weights on the host, then its rows.
  std::vector<bool> done(ids.size(), false);
  for (size_t first = 0; first < ids.size(); ++first) {
    if (done[first]) continue;
    const int64_t e = ids[first];
    const ref::PreparedMlp m = forward_mlp(data.g.ptr, data.u.ptr, data.d.ptr, e * I * H, H, I);
    for (size_t slot = first; slot < ids.size(); ++slot) {
      if (done[slot] || ids[slot] != e) continue;
      ref::mlp_row_forward(m, x[slot / size_t(K)].data(), r, row);
      std::copy(row.y.begin(), row.y.end(), y_slots.begin() + std::ptrdiff_t(slot * size_t(H)));
      done[slot] = true;
    }
  }
  std::vector<double> want(P * size_t(H)), got;
  ref::combine_rows(r, int64_t(P), H, K, y_shared.data(), y_slots.data(), weights.data(),
                    want.data());
  for (const int64_t t : picks) {
    const std::vector<double> mine = bf16_values(data.out.ptr, t * H, H);
    got.insert(got.end(), mine.begin(), mine.end());
  }
  return relative_l2_error(got, want);
}

}  // namespace mok::tools

#endif  // MOK_WITH_CUDA_KERNELS
