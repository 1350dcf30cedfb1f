// The per-token reductions of the layer and the shared experts' backward, used by the reference and
// by each rank of the EP simulation, so that both sum the same terms in the same order.
#pragma once
#include <cstdint>

#include "reference/mlp_math.hpp"

namespace mok::ref {

// out[t] = shared[t] + sum_k w[t,k] * y[t*K + k], summed in FP64 in fixed k order, then stored.
void combine_rows(const Rounding& r, int64_t tokens, int64_t hidden, int64_t top_k,
                  const double* y_shared, const double* y_slots, const double* topk_weights,
                  double* out);

// d_x[t] = dx_shared[t] + sum_k dx[t*K + k], in fixed k order.
void reduce_input_grads(const Rounding& r, int64_t tokens, int64_t hidden, int64_t top_k,
                        const double* dx_shared, const double* dx_slots, double* d_x);

// Backward of the shared MLP over a rank's tokens: dx rows, and weight gradients summed in token
// order, tile_rows tokens per wgrad tile.
void shared_backward(const PreparedMlp& shared, const Rounding& r, const double* x,
                     const double* d_out, int64_t tokens, int tile_rows, double* dx, double* d_gate,
                     double* d_up, double* d_down);

}  // namespace mok::ref
