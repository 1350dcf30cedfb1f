#include "reference/layer_sums.hpp"

#include <algorithm>

namespace mok::ref {

void combine_rows(const Rounding& r, int64_t tokens, int64_t hidden, int64_t top_k,
                  const double* y_shared, const double* y_slots, const double* topk_weights,
                  double* out) {
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < hidden; ++h) {
      double acc = y_shared[t * hidden + h];
      for (int64_t k = 0; k < top_k; ++k)
        acc += r.store(topk_weights[t * top_k + k]) * y_slots[(t * top_k + k) * hidden + h];
      out[t * hidden + h] = r.store(acc);
    }
  }
}

void reduce_input_grads(const Rounding& r, int64_t tokens, int64_t hidden, int64_t top_k,
                        const double* dx_shared, const double* dx_slots, double* d_x) {
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < hidden; ++h) {
      double acc = dx_shared[t * hidden + h];
      for (int64_t k = 0; k < top_k; ++k) acc += dx_slots[(t * top_k + k) * hidden + h];
      d_x[t * hidden + h] = r.store(acc);
    }
  }
}

void shared_backward(const PreparedMlp& shared, const Rounding& r, const double* x,
                     const double* d_out, int64_t tokens, int tile_rows, double* dx, double* d_gate,
                     double* d_up, double* d_down) {
  const int64_t H = shared.hidden;
  MlpGradAccumulator acc(H, shared.width);
  for (int64_t tile = 0; tile < tokens; tile += tile_rows) {
    const int64_t n = std::min<int64_t>(tile_rows, tokens - tile);
    std::vector<RowBackward> rows(static_cast<size_t>(n));
    std::vector<const RowBackward*> rp(static_cast<size_t>(n));
    std::vector<const double*> xp(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) {
      const int64_t t = tile + j;
      xp[size_t(j)] = x + t * H;
      mlp_row_backward(shared, xp[size_t(j)], d_out + t * H, 1.0, r, rows[size_t(j)]);
      rp[size_t(j)] = &rows[size_t(j)];
      std::copy(rows[size_t(j)].dx.begin(), rows[size_t(j)].dx.end(), dx + t * H);
    }
    acc.add_tile(rp.data(), xp.data(), n, r);
  }
  acc.finish(r, d_gate, d_up, d_down);
}

}  // namespace mok::ref
