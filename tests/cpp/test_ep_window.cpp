// EpForward's and EpBackward's symmetric window layouts (src/layer/ep_window_layout.hpp): for every
// standard shape and EP size, the regions come in order, do not overlap, hold what the forward or
// backward writes there, are aligned for 16-byte vector access, and the window size is what NCCL
// registers (4096-byte units).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "layer/ep_window_layout.hpp"
#include "mok/config.hpp"

namespace {

struct Region {
  const char* name;
  size_t begin, bytes;
};

// Regions in window order, the last one's end, and the window's size.
void expect_ordered_disjoint_aligned(const std::vector<Region>& regions, size_t window_bytes) {
  for (size_t i = 0; i < regions.size(); ++i) {
    const Region& r = regions[i];
    EXPECT_EQ(r.begin % 256, 0u) << r.name;
    const size_t end = i + 1 < regions.size() ? regions[i + 1].begin : window_bytes;
    EXPECT_GE(end, r.begin + r.bytes) << r.name << " overlaps what follows it";
  }
  EXPECT_EQ(window_bytes % 4096, 0u);
  const Region& last = regions.back();
  EXPECT_LT(window_bytes - (last.begin + last.bytes), 4096u + 256u) << "no slack beyond alignment";
}

}  // namespace

TEST(EpWindow, RegionsAreOrderedDisjointAlignedAndLargeEnough) {
  const size_t status_bytes = 32;  // the device Status record is 32 bytes today; any size works
  for (const char* name : {"tiny", "dsv3", "mok-default", "qwen3-30b", "fine"})
    for (int ep : {1, 2, 4, 8}) {
      SCOPED_TRACE(std::string(name) + ", ep " + std::to_string(ep));
      mok::Config c = mok::preset(name);
      if (c.num_experts % ep != 0) continue;
      c.ep_size = ep;
      const size_t T = size_t(c.max_tokens_per_rank), H = size_t(c.hidden), K = size_t(c.top_k),
                   E = size_t(c.num_experts), n = size_t(ep);
      // x's rows: BF16, or quantized on the source rank (fp8_block: H codes and H / 128 FP32
      // scales; mxfp8: H / 32 E8M0 scales; each row padded to 16 bytes).
      for (size_t row_bytes :
           {size_t(0), H + (H / 128 * 4 + 15) / 16 * 16, H + (H / 32 + 15) / 16 * 16}) {
        SCOPED_TRACE("x row bytes " + std::to_string(row_bytes));
        const auto L = mok::gpu::detail::ep_window_layout(c, status_bytes, row_bytes);
        const std::vector<Region> regions = {
            {"x", L.x, row_bytes ? T * row_bytes : T * H * 2},
            {"offsets", L.offsets, (E + 1) * 4},
            {"sorted", L.sorted, T * K * 4},
            {"y_slots", L.y_slots, T * K * H * 2},
            {"token_done", L.token_done, T * 4},
            {"counts", L.counts, 2 * n * E * 4},
            {"status", L.status, 2 * n * status_bytes},
            {"flags", L.flags, 2 * n * 4},
        };
        expect_ordered_disjoint_aligned(regions, L.bytes);
      }
    }
}

TEST(EpWindow, BackwardRegionsAreOrderedDisjointAlignedAndLargeEnough) {
  for (const char* name : {"tiny", "dsv3", "mok-default", "qwen3-30b", "fine"})
    for (int ep : {1, 2, 4, 8}) {
      SCOPED_TRACE(std::string(name) + ", ep " + std::to_string(ep));
      mok::Config c = mok::preset(name);
      if (c.num_experts % ep != 0) continue;
      c.ep_size = ep;
      const size_t T = size_t(c.max_tokens_per_rank), H = size_t(c.hidden), K = size_t(c.top_k),
                   I = size_t(c.intermediate), n = size_t(ep);
      const size_t partials = T * K * (I / 128);  // per (token, k): one float per 128 columns
      // BF16 (no quantized d_out rows) and fp8_block's rows (H codes, H / 128 FP32 scales).
      for (const size_t dy_row : {size_t(0), H + H / 128 * 4}) {
        const auto L = mok::gpu::detail::ep_backward_window_layout(c, partials, dy_row);
        expect_ordered_disjoint_aligned({{"x", L.x, T * H * 2},
                                         {"d_out", L.d_out, T * H * 2},
                                         {"dy_rows", L.dy_rows, T * dy_row},
                                         {"topk_weights", L.topk_weights, T * K * 4},
                                         {"dx_slots", L.dx_slots, T * K * H * 2},
                                         {"dw_partial", L.dw_partial, partials * 4},
                                         {"token_done", L.token_done, T * 4},
                                         {"flags", L.flags, 2 * n * 4}},
                                        L.bytes);
        EXPECT_EQ(L.x, 0u);
      }
    }
}
