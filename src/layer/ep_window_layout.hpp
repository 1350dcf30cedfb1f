// The layout of EpForward's symmetric window (host only; every rank computes the same offsets from
// the same Config). The exchange area is double-buffered by the parity of the forward's epoch: a
// rank can be at most one forward ahead of a peer's exchange (it cannot finish forward e + 1's
// exchange before every peer has published e + 1, which each does only after finishing e's).
#pragma once
#include <cstddef>

#include "mok/config.hpp"

namespace mok::gpu::detail {

struct EpWindowLayout {
  size_t x, offsets, sorted, y_slots, token_done, counts, status, flags, bytes;
};

// status_bytes: sizeof the schedule's Status record (a device-side struct).
inline EpWindowLayout ep_window_layout(const Config& c, size_t status_bytes) {
  const size_t T = size_t(c.max_tokens_per_rank), H = size_t(c.hidden), K = size_t(c.top_k),
               E = size_t(c.num_experts), n = size_t(c.ep_size);
  size_t at = 0;
  auto take = [&](size_t bytes) {  // 256-byte aligned regions, in order
    const size_t begin = at;
    at = (at + bytes + 255) / 256 * 256;
    return begin;
  };
  EpWindowLayout L;
  L.x = take(T * H * 2);                  // [T, H] BF16: the rows owners pull
  L.offsets = take((E + 1) * 4);          // the source schedule owners read
  L.sorted = take(T * K * 4);             //
  L.y_slots = take(T * K * H * 2);        // [T * K, H] BF16: owners write expert outputs
  L.token_done = take(T * 4);             // [T]: owners release one per finished (token, k)
  L.counts = take(2 * n * E * 4);         // [parity][source][E]
  L.status = take(2 * n * status_bytes);  // [parity][source]
  L.flags = take(2 * n * 4);              // [parity][source]: the epoch, once published
  L.bytes = (at + 4095) / 4096 * 4096;    // NCCL_WIN_REQUIRED_ALIGNMENT
  return L;
}

}  // namespace mok::gpu::detail
