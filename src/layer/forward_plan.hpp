// How a forward runs, resolved once from the configuration, the options and the hooks (validated
// here, with clear errors): the row path, the megakernel instantiation, the grid and each rank's
// dispatch CTAs, the tile groups and the wait bound. Nothing downstream reads ForwardOptions.
#pragma once
#include <cstdint>

#include "kernels/moe_forward/forward_params.hpp"
#include "layer/forward_hooks.hpp"
#include "mok/config.hpp"
#include "mok/gpu/moe_forward.hpp"

namespace mok::gpu::detail {

// The kernels' name for a precision's routed experts (forward and backward instantiations).
constexpr kern::RoutedWeights routed_weights(Precision p) {
  return p == Precision::fp8_block ? kern::RoutedWeights::fp8_block
         : p == Precision::nvfp4   ? kern::RoutedWeights::nvfp4
         : p == Precision::mxfp8   ? kern::RoutedWeights::mxfp8
                                   : kern::RoutedWeights::bf16;
}

// Whether the dispatch copy beats the producer gather for batches of max_tokens_per_rank tokens,
// with GEMM tiles block_n wide. TMA-loaded rows starve the consumers less than gathered ones. At
// EP = 1 that pays where an expert has much GEMM work for its rows (rows per expert x I of one
// full 128-row block at I = 2048 or more), and always with 128-wide tiles, which gather the same
// rows for half the weight columns (9 random shapes of 1-78 rows per expert: the copy 6-18%
// faster); with 256-wide tiles below the threshold the gather wins (fine, qwen3-30b, dsv3 and
// mok-default at 20-160 rows per expert: 2-10%). Under EP (dispatch CTAs run anyway; the copy
// only adds the rank's own rows): two or more full row blocks per local expert and I >= 2048.
// The measurements behind the thresholds: docs/benchmarks.md, lever index ("row path").
constexpr bool copy_rows_pays_off(int64_t max_tokens_per_rank, int top_k, int experts, int ep_size,
                                  int intermediate, int block_n) {
  const int64_t rows_per_local_expert = max_tokens_per_rank * ep_size * top_k / experts;
  if (ep_size == 1)
    return block_n == 128 || rows_per_local_expert * intermediate >= int64_t(128) * 2048;
  return rows_per_local_expert >= 2 * 128 && intermediate >= 2048;
}
static_assert(copy_rows_pays_off(8192, 8, 256, 1, 2048, 256) &&
              copy_rows_pays_off(4096, 8, 256, 1, 2048, 256) &&
              copy_rows_pays_off(8192, 8, 128, 1, 768, 256) &&
              copy_rows_pays_off(11, 10, 216, 1, 6336, 128));
static_assert(!copy_rows_pays_off(3072, 8, 256, 1, 2048, 256) &&
              !copy_rows_pays_off(4096, 8, 128, 1, 768, 256) &&
              !copy_rows_pays_off(8192, 10, 512, 1, 512, 256) &&
              !copy_rows_pays_off(1024, 10, 512, 1, 512, 256) &&
              !copy_rows_pays_off(2048, 6, 384, 1, 3072, 256));
static_assert(copy_rows_pays_off(4096, 8, 256, 2, 2048, 256) &&
              !copy_rows_pays_off(2048, 8, 256, 2, 2048, 256) &&
              !copy_rows_pays_off(8192, 8, 128, 2, 768, 128) &&
              !copy_rows_pays_off(2048, 6, 384, 2, 3072, 256) &&
              !copy_rows_pays_off(4096, 10, 512, 2, 512, 256));

// Dispatch CTAs for a GPU (or a logical rank's share) of `sms` SMs: enough to bring rows faster
// than the GEMM CTAs consume them; they join the GEMMs afterwards, so a few too many cost little.
// A row moves 4H bytes against ~6IH FLOPs of expert work, so the share grows as I shrinks:
// sms / 16 times round(1536 / I), between 1 and 3 (lever index: "dispatch CTAs").
constexpr int num_dispatch_ctas(int sms, int intermediate) {
  const int per_1536 = (1536 + intermediate / 2) / intermediate;
  return (sms >= 64 ? sms / 16 : 1) * (per_1536 < 1 ? 1 : per_1536 > 3 ? 3 : per_1536);
}
static_assert(num_dispatch_ctas(132, 2048) == 8 && num_dispatch_ctas(132, 3072) == 8);
static_assert(num_dispatch_ctas(132, 768) == 16 && num_dispatch_ctas(132, 512) == 24);
static_assert(num_dispatch_ctas(132, 128) == 24 && num_dispatch_ctas(16, 128) == 3);

// The host side of a forward: one rank on its own (EP = 1), an emulated group (every rank in one
// launch on one GPU), or one rank of an NCCL group.
enum class Transport { local, emulated, nccl };

struct ForwardPlan {
  Transport transport = Transport::local;
  int ranks_in_launch = 1;                      // ep_size when the group is emulated, else 1
  RowPath row_path = RowPath::producer_gather;  // never automatic
  kern::ForwardKernel kernel;
  const kern::ForwardKernels* kernels = nullptr;
  int grid = 0, dispatch_ctas = 0;  // dispatch CTAs per rank's share of the grid
  int group_blocks = 0;             // routed row blocks per tile group
  double wait_seconds = 0;
  uint64_t wait_cycles = 0;
};

// The current device's SM count and its clock in kHz (2 GHz where the driver reports none): a
// persistent grid's size and a wait bound's cycles.
struct DeviceSmsAndClock {
  int sms, clock_khz;
};
DeviceSmsAndClock current_device_sms_and_clock();

// A wait bound in seconds: `seconds`, or when 0 the environment's MOK_WAIT_SECONDS if set, else 2;
// throws outside (0, 600].
double resolve_wait_seconds(double seconds);

// `who` names the class in messages. Prepares the kernel (shared-memory opt-in) on the current
// device.
ForwardPlan plan_forward(const Config& c, const ForwardOptions& o, const ForwardHooks& h,
                         Transport transport, const char* who);

}  // namespace mok::gpu::detail
