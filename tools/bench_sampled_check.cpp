#include "bench_sampled_check.hpp"

#if defined(MOK_WITH_CUDA_KERNELS)

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>

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

// One MLP's weights as the reference's row math reads them. The values are BF16 already, which
// the reference's BF16 operand rounding leaves as they are; with `backward` the dgrad GEMMs'
// copies too (the same values: no recipe quantizes them here).
ref::PreparedMlp prepared_mlp(const __nv_bfloat16* gate, const __nv_bfloat16* up,
                              const __nv_bfloat16* down, int64_t first, int64_t hidden,
                              int64_t width, bool backward) {
  ref::PreparedMlp m;
  m.hidden = hidden;
  m.width = width;
  m.gate_fwd = bf16_values(gate, first, width * hidden);
  m.up_fwd = bf16_values(up, first, width * hidden);
  m.down_fwd = bf16_values(down, first, hidden * width);
  if (backward) {
    m.gate_bwd = m.gate_fwd;
    m.up_bwd = m.up_fwd;
    m.down_bwd = m.down_fwd;
  }
  return m;
}

// The relative L2 error of `got`'s sampled rows against the reference with rounding r: the
// layer's output, or with d_out given its d_x (shared dx + the sum over k of each slot's dx) and,
// with got_d_weights [T, K] given too, that of the sampled slots' router-weight gradients.
SampledErrors sampled_errors(const Config& c, const BenchLayer& data, const __nv_bfloat16* got_rows,
                             const __nv_bfloat16* d_out_rows, const ref::Rounding& r,
                             const float* got_d_weights = nullptr) {
  const int64_t T = data.tokens, H = c.hidden, I = c.intermediate, S = c.shared_width(),
                K = c.top_k;
  if (T == 0) return {};
  const bool backward = d_out_rows != nullptr;
  const std::vector<int64_t> picks = sampled_tokens(T);
  const size_t P = picks.size();
  const ref::Rounding shared_r = r.for_shared();
  std::vector<std::vector<double>> x(P), d_out(P);
  std::vector<int32_t> ids(P * size_t(K));
  std::vector<double> weights(P * size_t(K)), y_shared(P * size_t(H), 0.0),
      y_slots(P * size_t(K * H)), d_weights(P * size_t(K));
  for (size_t p = 0; p < P; ++p) {
    x[p] = bf16_values(data.x.ptr, picks[p] * H, H);
    if (backward) d_out[p] = bf16_values(d_out_rows, picks[p] * H, H);
    std::vector<float> w(static_cast<size_t>(K));
    cuda_ok(cudaMemcpy(&ids[p * size_t(K)], data.ids.ptr + picks[p] * K, size_t(K) * 4,
                       cudaMemcpyDeviceToHost),
            "cudaMemcpy");
    cuda_ok(cudaMemcpy(w.data(), data.w.ptr + picks[p] * K, size_t(K) * 4, cudaMemcpyDeviceToHost),
            "cudaMemcpy");
    std::copy(w.begin(), w.end(), weights.begin() + std::ptrdiff_t(p * size_t(K)));
  }
  // Row p's shared output (or dx), and slot (p, k)'s expert output (or dx, weighted).
  auto row = [&](const ref::PreparedMlp& m, size_t p, double weight, const ref::Rounding& rr,
                 ref::RowBackward& out) -> const std::vector<double>& {
    if (!backward) {
      ref::mlp_row_forward(m, x[p].data(), rr, out.fwd);
      return out.fwd.y;
    }
    ref::mlp_row_backward(m, x[p].data(), d_out[p].data(), weight, rr, out);
    return out.dx;
  };
  if (S > 0) {
    const ref::PreparedMlp shared =
        prepared_mlp(data.sg.ptr, data.su.ptr, data.sd.ptr, 0, H, S, backward);
    ref::RowBackward out;
    for (size_t p = 0; p < P; ++p) {
      const std::vector<double>& y = row(shared, p, 1.0, shared_r, out);
      std::copy(y.begin(), y.end(), y_shared.begin() + std::ptrdiff_t(p * size_t(H)));
    }
  }
  // Each expert the sampled tokens use, once: its weights on the host, then its rows. The experts
  // are independent (each writes only its own slots), so up to 8 threads take them: one thread
  // made this check most of a sweep shape's time (s29e: s17, whose three sampled tokens use 30
  // experts of 3520 x 5952 weights, took 15 s; its timed GPU runs, about 0.1 s).
  std::vector<int32_t> experts;
  for (const int32_t e : ids)
    if (std::find(experts.begin(), experts.end(), e) == experts.end()) experts.push_back(e);
  std::atomic<size_t> next{0};
  std::exception_ptr failed;  // the first thread's error (a CUDA copy), rethrown here
  std::mutex failed_lock;
  int device = 0;
  cuda_ok(cudaGetDevice(&device), "cudaGetDevice");
  auto work = [&] {
    ref::RowBackward out;
    try {
      cuda_ok(cudaSetDevice(device), "cudaSetDevice");  // a new thread starts on device 0
      for (size_t i = next++; i < experts.size(); i = next++) {
        const int64_t e = experts[i];
        const ref::PreparedMlp m =
            prepared_mlp(data.g.ptr, data.u.ptr, data.d.ptr, e * I * H, H, I, backward);
        for (size_t slot = 0; slot < ids.size(); ++slot) {
          if (ids[slot] != e) continue;
          const std::vector<double>& y = row(m, slot / size_t(K), weights[slot], r, out);
          std::copy(y.begin(), y.end(), y_slots.begin() + std::ptrdiff_t(slot * size_t(H)));
          d_weights[slot] = out.d_weight;
        }
      }
    } catch (...) {
      next = experts.size();  // the others stop at their next expert
      const std::lock_guard<std::mutex> hold(failed_lock);
      if (!failed) failed = std::current_exception();
    }
  };
  const size_t threads =
      std::min<size_t>({experts.size(), 8, std::max(1u, std::thread::hardware_concurrency())});
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  if (failed) std::rethrow_exception(failed);
  std::vector<double> want(P * size_t(H)), got;
  if (backward)
    ref::reduce_input_grads(r, int64_t(P), H, K, y_shared.data(), y_slots.data(), want.data());
  else
    ref::combine_rows(r, int64_t(P), H, K, y_shared.data(), y_slots.data(), weights.data(),
                      want.data());
  std::vector<double> got_w;
  for (const int64_t t : picks) {
    const std::vector<double> mine = bf16_values(got_rows, t * H, H);
    got.insert(got.end(), mine.begin(), mine.end());
    if (got_d_weights) {
      std::vector<float> w(static_cast<size_t>(K));
      cuda_ok(cudaMemcpy(w.data(), got_d_weights + t * K, size_t(K) * 4, cudaMemcpyDeviceToHost),
              "cudaMemcpy");
      got_w.insert(got_w.end(), w.begin(), w.end());
    }
  }
  SampledErrors e;
  e.rows = relative_l2_error(got, want);
  if (got_d_weights) e.d_topk_weights = relative_l2_error(got_w, d_weights);
  return e;
}

}  // namespace

std::vector<int64_t> sampled_tokens(int64_t tokens) {
  std::vector<int64_t> picks;
  if (tokens > 0) picks.push_back(0);
  if (tokens / 2 > 0) picks.push_back(tokens / 2);
  if (tokens - 1 > tokens / 2) picks.push_back(tokens - 1);
  return picks;
}

double sampled_reference_error(const Config& c, const BenchLayer& data) {
  ref::Rounding r;
  r.numerics = Numerics::fp32;
  r.quant = OperandQuant::bf16;
  return sampled_errors(c, data, data.out.ptr, nullptr, r).rows;
}

SampledErrors sampled_backward_errors(const Config& c, const BenchLayer& data,
                                      const __nv_bfloat16* d_x, const __nv_bfloat16* d_out,
                                      const float* d_topk_weights) {
  ref::Rounding r;
  r.numerics = Numerics::fp32;
  r.quant = OperandQuant::bf16;
  return sampled_errors(c, data, d_x, d_out, r, d_topk_weights);
}

double sampled_exact_error(const Config& c, const BenchLayer& data, const __nv_bfloat16* got,
                           const __nv_bfloat16* d_out) {
  ref::Rounding r;
  r.numerics = Numerics::fp64;
  r.quant = OperandQuant::none;
  return sampled_errors(c, data, got, d_out, r).rows;
}

}  // namespace mok::tools

#endif  // MOK_WITH_CUDA_KERNELS
