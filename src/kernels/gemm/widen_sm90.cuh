// Narrow weights widened in shared memory on their way to BF16 wgmma (Hopper has no FP4 MMA and no
// block-scaled one): the producer's TMA leader loads a stage's packed codes and block factors into
// a staging slot, the converter warps of the producer warpgroup expand them into the BF16 B tile
// of the ring stage (128B-swizzled, K-major or MN-major, as TMA would have written it), then
// arrive on the stage's full barrier beside the leader. The consumers' mainloop is the BF16 one.
// NVFP4 (mok/formats/nvfp4_widen.hpp): per 8 elements one 32-bit code word, one BF16 factor, one
// bf16x2 product per element pair. MXFP8 (mok/formats/mxfp8_widen.hpp): per 8 elements two code
// words, likewise. The converters bound the widening programs (their issue rate, not the codes'
// latency: `mok bench --breakdown 1`), so each lane's work is shaped for fewer instructions.
#pragma once
#include <cstdint>

#include "kernels/gemm/tile_geometry.cuh"
#include "mok/device/mbarrier.cuh"
#include "mok/device/sync.cuh"
#include "mok/device/tma.cuh"
#include "mok/formats/mxfp8_widen.hpp"
#include "mok/formats/nvfp4_widen.hpp"

namespace mok::kern {

// d = a * b on bf16x2 bit patterns (sm_90's mul.bf16x2: round to nearest, subnormals kept; the
// widening's products are exact, but for MXFP8 blocks whose values fall below BF16's normal range,
// scales 0-2: there BF16's subnormals round them).
__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// The converter warps are the producer warpgroup's last (Program::kWidenWarps of them: the
// forward's warps 1-3; the backward's 2-3, beside its store warp 1); warp 0's lane 0 issues the TMA
// loads.
// Staging slots: at most three (with three the TMA runs two stages ahead of the converters, with
// two one); Program::kWidenSlots.
constexpr int kWidenSlots = 3;

// One packed NVFP4 word (8 elements) times its block's BF16 factor: 16 bytes of BF16 (the values
// times 2^-8), per pair one exact product.
__device__ __forceinline__ uint4 nvfp4_widen_word(uint32_t word, uint16_t factor_bits) {
  const uint32_t factor = uint32_t(factor_bits) * 0x10001u;
  uint32_t out[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) out[j] = mul_bf16x2(fmt::nvfp4_widen_pair_bits(word, j), factor);
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// A converter lane's step is two adjacent 16-byte output chunks of one row (16 elements: NVFP4's
// whole 16-column block, half of MXFP8's 32), loaded from a staging slot in one access with their
// one factor, widened once every load of a batch is in.
struct Nvfp4Codes {
  uint2 words;
  uint16_t factor;
  __device__ uint4 widen(int j) const { return nvfp4_widen_word(j ? words.y : words.x, factor); }
};

// A staging slot of a kRows-row B tile (a gate/up tile: gate rows, then up rows): the rows'
// codes for one ring stage (kRowCodeBytes each), then per half of the rows its factors
// (kHalfFactorBytes), each half one TMA box at a 128-byte boundary (TMA's shared-memory alignment).
template <int kRows, uint32_t kRowCodeBytes_, uint32_t kHalfFactorBytes_>
struct StagingSlot {
  static constexpr uint32_t kRowCodeBytes = kRowCodeBytes_;
  static constexpr uint32_t kHalfFactorBytes = kHalfFactorBytes_;
  static constexpr uint32_t kCodeBytes = uint32_t(kRows) * kRowCodeBytes;
  static constexpr uint32_t kHalfStride = (kHalfFactorBytes + 127) / 128 * 128;
  static constexpr uint32_t kBytes = kCodeBytes + 2 * kHalfFactorBytes;  // TMA transaction bytes
  static constexpr uint32_t kSlotBytes = kCodeBytes + 2 * kHalfStride;
  static_assert(kRows % 8 == 0 && kRows <= 256, "halves of whole warp steps, one TMA box");
  static_assert(kCodeBytes % 128 == 0 && kHalfFactorBytes % 16 == 0 && kHalfFactorBytes <= 256,
                "boxes at 128-byte boundaries, whole 16-byte units, at most 256 bytes wide");
  // Where the factors of row r's half begin in the slot, and r's row inside that half.
  __host__ __device__ static constexpr uint32_t half_offset(uint32_t r) {
    return kCodeBytes + r / (kRows / 2) * kHalfStride;
  }
  __host__ __device__ static constexpr uint32_t in_half(uint32_t r) { return r % (kRows / 2); }
};

// NVFP4: 32 code bytes per row (mok/formats/nvfp4_widen.hpp's packed words), per 16 rows the 4
// factors of the stage's 16x16 blocks.
template <int kRows>
struct Nvfp4Stage : StagingSlot<kRows, kBlockK / 2, uint32_t(kRows / 2 / 16) * 4 * 2> {
  using Slot = StagingSlot<kRows, kBlockK / 2, uint32_t(kRows / 2 / 16) * 4 * 2>;
  static_assert(kRows % 32 == 0, "halves of whole 16-row scale blocks");
  static_assert(fmt::kNvfp4WidenK == kBlockK, "one staging slot per BF16 ring stage");
  // Offset of the factor of row r's 16-column block b (0-3) in the slot.
  __host__ __device__ static constexpr uint32_t factor_offset(uint32_t r, uint32_t b) {
    return Slot::half_offset(r) + Slot::in_half(r) / 16u * 8u + b * 2u;
  }
  // Byte coordinate of row `row`'s factors in a stage's row of the factor map.
  __host__ __device__ static constexpr int factor_x(int row) { return row / 16 * 8; }
  // Row `row`'s output chunks 2 pair and 2 pair + 1 (16-column block `pair`): two code words and
  // the block's factor.
  using Codes = Nvfp4Codes;
  __device__ static Codes load(uint32_t slot, uint32_t row, uint32_t pair) {
    return {dev::ld_shared_v2(slot + row * 32u + pair * 8u),
            dev::ld_shared_u16(slot + factor_offset(row, pair))};
  }
};

// NVFP4 weights read along their rows (the backward's dgrad GEMMs contract over a weight's rows,
// and an MN-major B tile wants those rows as its K): a stage's 64 K rows are 64 rows of the
// weight, each kCols codes of columns [n0, n0 + kCols) (kCols / 2 bytes, one TMA box); their
// factors, per 64-column forward stage of the packed layout (kCols / 64 of them), are the 64
// rows' 4 x 4 blocks: 32 contiguous bytes, one box of kCols / 64 rows of 32 bytes. No transposed
// copy: the forward's packed weights, widened into Bf16MnMajorB's B tile (per 64 columns a block of
// 64 K rows x 128 bytes, 128B-swizzled).
template <int kCols>
struct Nvfp4MnStage {
  static constexpr uint32_t kRowCodeBytes = uint32_t(kCols) / 2;
  static constexpr uint32_t kCodeBytes = uint32_t(kBlockK) * kRowCodeBytes;
  static constexpr uint32_t kFactorBytes = uint32_t(kCols) / 64 * 32;
  static constexpr uint32_t kBytes = kCodeBytes + kFactorBytes;  // TMA transaction bytes
  static constexpr uint32_t kSlotBytes = (kBytes + 127) / 128 * 128;
  static constexpr int kChunks = kCols / 8;  // 16-byte output chunks per K row
  static_assert(kCols % 64 == 0 && kCols <= 256, "whole 64-column blocks, one TMA box of codes");
  static_assert(fmt::kNvfp4WidenK == kBlockK && kBlockK % 16 == 0, "whole 16-row scale blocks");
  static_assert(32 % (kChunks / 2) == 0, "a warp step widens whole K rows");
  // Offset of the factor of K row r's 16-column block b (0 to kCols / 16 - 1): forward stage
  // b / 4, the row's 16-row block, column block b % 4 (nvfp4_widen_factor_offset's order).
  __host__ __device__ static constexpr uint32_t factor_offset(uint32_t r, uint32_t b) {
    return kCodeBytes + ((b / 4u * 4u + r / 16u) * 4u + b % 4u) * 2u;
  }
  // Byte coordinate of K rows [k0, k0 + 64)'s factors in a row of the factor map.
  __host__ __device__ static constexpr int factor_x(int k0) { return k0 / 16 * 8; }
  // K row `row`'s output chunks 2 pair and 2 pair + 1 (columns 16 pair to 16 pair + 15).
  using Codes = Nvfp4Codes;
  __device__ static Codes load(uint32_t slot, uint32_t row, uint32_t pair) {
    return {dev::ld_shared_v2(slot + row * kRowCodeBytes + pair * 8u),
            dev::ld_shared_u16(slot + factor_offset(row, pair))};
  }
};

// MXFP8: 64 code bytes per row, per row the 2 factors of the stage's 32-column blocks.
template <int kRows>
struct Mxfp8Stage : StagingSlot<kRows, kBlockK, uint32_t(kRows / 2) * 2 * 2> {
  using Slot = StagingSlot<kRows, kBlockK, uint32_t(kRows / 2) * 2 * 2>;
  static_assert(fmt::kMxfp8WidenK == kBlockK, "one staging slot per BF16 ring stage");
  __host__ __device__ static constexpr uint32_t factor_offset(uint32_t r, uint32_t b) {
    return Slot::half_offset(r) + Slot::in_half(r) * 4u + b * 2u;
  }
  __host__ __device__ static constexpr int factor_x(int row) { return row * 4; }
  // Row `row`'s output chunks 2 pair and 2 pair + 1 (16 codes, half of a 32-column block).
  struct Codes {
    uint4 words;
    uint16_t factor;
    __device__ uint4 widen(int j) const {
      const uint32_t pre = uint32_t(fmt::kMxfp8WidenPre) * 0x10001u;
      const uint32_t f = uint32_t(factor) * 0x10001u;
      const uint32_t w[2] = {j ? words.z : words.x, j ? words.w : words.y};
      uint32_t out[4];
#pragma unroll
      for (int k = 0; k < 4; ++k)
        out[k] = mul_bf16x2(mul_bf16x2(fmt::mxfp8_widen_pair_bits(w[k / 2], k % 2), pre), f);
      return make_uint4(out[0], out[1], out[2], out[3]);
    }
  };
  __device__ static Codes load(uint32_t slot, uint32_t row, uint32_t pair) {
    return {dev::ld_shared_v4(slot + row * 64u + pair * 16u),
            dev::ld_shared_u16(slot + factor_offset(row, pair / 2))};
  }
};

// The staging ring: slots after the BF16 ring in dynamic shared memory, a full barrier per slot
// (the leader's arrive_expect_tx and the TMA bytes) and an empty one (each of kWarps converters);
// kSlots of them.
template <int kSlotBytes, int kWarps, int kSlots>
struct WidenRing {
  uint8_t* slots;
  uint64_t* full;
  uint64_t* empty;
  __device__ uint8_t* slot(int s) const { return slots + s * kSlotBytes; }
  // By thread 0, before the CTA's first __syncthreads.
  __device__ void init() const {
    for (int s = 0; s < kSlots; ++s) {
      dev::mbar_init(&full[s], 1);
      dev::mbar_init(&empty[s], kWarps);
    }
  }
};

// A converter warp's steps, software-pipelined: step i's codes are loaded kWidenAhead steps before
// they are widened and stored, so shared memory's latency hides behind the steps between (the
// compiler cannot move a load above a store, which may alias the slot: only the program order
// can). Step i of warp `warp` widens Stage::load(slot, row(i), pair) into tile_b + offset(row(i),
// j) for its chunks j = 0, 1. Unrolled whole: the codes stay in registers, kWidenAhead + 1 live.
constexpr int kWidenAhead = 3;
template <class Stage, int kSteps, int kWarps, class Row, class Offset>
__device__ __forceinline__ void widen_steps(const uint8_t* slot_ptr, uint8_t* tile_b_ptr, int warp,
                                            uint32_t pair, Row row, Offset offset) {
  constexpr int kMaxSteps = (kSteps + kWarps - 1) / kWarps;
  const int steps = (kSteps - warp + kWarps - 1) / kWarps;
  const uint32_t slot = dev::smem_addr(slot_ptr), tile_b = dev::smem_addr(tile_b_ptr);
  typename Stage::Codes codes[kMaxSteps];
#pragma unroll
  for (int i = 0; i < kMaxSteps + kWidenAhead; ++i) {
    if (i < kMaxSteps && i < steps) codes[i] = Stage::load(slot, row(warp + i * kWarps), pair);
    const int s = i - kWidenAhead;
    if (s >= 0 && s < steps) {
      const uint32_t r = row(warp + s * kWarps);
#pragma unroll
      for (int j = 0; j < 2; ++j)
        dev::st_shared_v4(tile_b + offset(r, uint32_t(j)), codes[s].widen(j));
    }
  }
}

// Converter warp `warp` (0 to kWarps - 1) widens its share of a staged tile (Stage: Nvfp4Stage or
// Mxfp8Stage) into the K-major BF16 B tile: lane l takes output chunks 2 (l % 4) and 2 (l % 4) + 1
// of rows 8 g + l / 4 for g = warp, warp + kWarps, ... (a warp reads whole rows of codes; each
// 8-lane phase of a store writes two rows' chunks, all eight 16-byte bank groups).
template <class Stage, int kWarps, int kRows = int(Stage::kCodeBytes / Stage::kRowCodeBytes)>
__device__ __forceinline__ void widen_tile(const uint8_t* slot, uint8_t* tile_b, int warp,
                                           int lane) {
  static_assert(kRows % 8 == 0, "whole warp steps");
  const uint32_t pair = uint32_t(lane % 4), lane_row = uint32_t(lane / 4);
  widen_steps<Stage, kRows / 8, kWarps>(
      slot, tile_b, warp, pair, [&](int g) { return uint32_t(8 * g) + lane_row; },
      [&](uint32_t row, uint32_t j) { return dev::swizzle128_offset(row, (2u * pair + j) * 16u); });
}

// Converter warp `warp` (0 to kWarps - 1) widens its share of a staged Nvfp4MnStage into the
// MN-major BF16 B tile: per step a warp takes 64 / kChunks whole K rows, lane l two adjacent
// chunks of them (its code words: a warp reads whole rows, conflict-free; each 64-column block's
// row is one whole swizzled 128-byte row).
template <class Stage, int kWarps>
__device__ __forceinline__ void widen_tile_mn(const uint8_t* slot, uint8_t* tile_b, int warp,
                                              int lane) {
  constexpr int kPairs = Stage::kChunks / 2, kRowsPerStep = 32 / kPairs;
  const uint32_t pair = uint32_t(lane % kPairs), lane_row = uint32_t(lane / kPairs);
  const uint32_t block = pair / 4u * uint32_t(kBlockK) * 128u;  // the pair's 64-column block
  widen_steps<Stage, kBlockK / kRowsPerStep, kWarps>(
      slot, tile_b, warp, pair, [&](int g) { return uint32_t(g * kRowsPerStep) + lane_row; },
      [&](uint32_t row, uint32_t j) {
        return block + dev::swizzle128_offset(row, (2u * pair + j) % 8u * 16u);
      });
}

}  // namespace mok::kern
