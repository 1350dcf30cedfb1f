// The CTA shape every sm_90a GEMM kernel of mok shares: a 128-row output tile per CTA step, two
// consumer warpgroups (64 rows each) and one producer warpgroup. Row movers (dispatch, combine)
// and tile schedules include this without the wgmma pipeline.
#pragma once
#include "mok/schedule/routing_layout.hpp"

namespace mok::kern {

constexpr int kBlockM = sched::kGpuTileRows;  // the tile height's one source
// The forward's k-block: 64 BF16 = one 128-byte swizzle span (Bf16KMajor::kBlockK).
constexpr int kBlockK = 64;
constexpr int kConsumers = 2, kThreads = (kConsumers + 1) * 128;
constexpr int kProducerRegs = 40, kConsumerRegs = 232;
static_assert(kBlockM == kConsumers * 64, "one m64 wgmma row block per consumer warpgroup");
static_assert(128 * kProducerRegs + kConsumers * 128 * kConsumerRegs <= kThreads * 168,
              "setmaxnreg budget: the pool of 384 threads x 168 registers (pitfall 4)");

}  // namespace mok::kern
