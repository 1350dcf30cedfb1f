// The layouts of EpForward's and EpBackward's symmetric windows (host only; every rank computes the
// same offsets from the same Config). The exchange and barrier areas are double-buffered by the
// parity of the epoch: a rank can be at most one step ahead of a peer's exchange (it cannot finish
// step e + 1's exchange before every peer has published e + 1, which each does only after
// finishing e's).
#pragma once
#include <cstddef>

#include "mok/config.hpp"

namespace mok::gpu::detail {

// 256-byte aligned regions, in order.
struct WindowRegions {
  size_t at = 0;
  size_t take(size_t bytes) {
    const size_t begin = at;
    at = (at + bytes + 255) / 256 * 256;
    return begin;
  }
  size_t total() const { return (at + 4095) / 4096 * 4096; }  // NCCL_WIN_REQUIRED_ALIGNMENT
};

struct EpWindowLayout {
  size_t x, offsets, sorted, y_slots, token_done, counts, status, flags, bytes;
};

// status_bytes: sizeof the schedule's Status record (a device-side struct). x_row_bytes: 0 where
// owners pull x in BF16, else the bytes of one token's row quantized on this rank (fp8_block and
// mxfp8: kern::source_row_layout).
inline EpWindowLayout ep_window_layout(const Config& c, size_t status_bytes, size_t x_row_bytes) {
  const size_t T = size_t(c.max_tokens_per_rank), H = size_t(c.hidden), K = size_t(c.top_k),
               E = size_t(c.num_experts), n = size_t(c.ep_size);
  WindowRegions w;
  EpWindowLayout L;
  L.x = w.take(x_row_bytes ? T * x_row_bytes : T * H * 2);  // the rows owners pull: [T, H] BF16
                                                            // or [T, x_row_bytes]
  L.offsets = w.take((E + 1) * 4);                          // the source schedule owners read
  L.sorted = w.take(T * K * 4);                             //
  L.y_slots = w.take(T * K * H * 2);        // [T * K, H] BF16: owners write expert outputs
  L.token_done = w.take(T * 4);             // [T]: owners release one per finished (token, k)
  L.counts = w.take(2 * n * E * 4);         // [parity][source][E]
  L.status = w.take(2 * n * status_bytes);  // [parity][source]
  L.flags = w.take(2 * n * 4);              // [parity][source]: the epoch, once published
  L.bytes = w.total();
  return L;
}

// EpBackward's window: what owners pull (x, d_out, d_out quantized on this rank where the recipe
// reads it so, and the router weights of this rank's tokens) and what they write back (the dx
// slots, the router-weight partials per dgrad-down n-tile of 128 or more columns, the token
// counters), then the barrier's flags.
struct EpBackwardWindowLayout {
  size_t x, d_out, dy_rows, topk_weights, dx_slots, dw_partial, token_done, flags, bytes;
};

// dw_partial_floats: the router-weight partials' size (kern::dw_partial_floats, a device-side
// layout). dy_row_bytes: one token's quantized d_out row (kern::source_row_layout), 0 for none.
inline EpBackwardWindowLayout ep_backward_window_layout(const Config& c, size_t dw_partial_floats,
                                                        size_t dy_row_bytes) {
  const size_t T = size_t(c.max_tokens_per_rank), H = size_t(c.hidden), K = size_t(c.top_k),
               n = size_t(c.ep_size);
  WindowRegions w;
  EpBackwardWindowLayout L;
  L.x = w.take(T * H * 2);                       // [T, H] BF16
  L.d_out = w.take(T * H * 2);                   // [T, H] BF16
  L.dy_rows = w.take(T * dy_row_bytes);          // [T, dy_row_bytes]
  L.topk_weights = w.take(T * K * 4);            // [T, K] FP32
  L.dx_slots = w.take(T * K * H * 2);            // [T * K, H] BF16
  L.dw_partial = w.take(dw_partial_floats * 4);  // [T * K, I / 128] FP32
  L.token_done = w.take(T * 4);                  // [T]
  L.flags = w.take(2 * n * 4);                   // [parity][source]: the epoch, once arrived
  L.bytes = w.total();
  return L;
}

}  // namespace mok::gpu::detail
