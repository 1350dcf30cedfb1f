// MMA traits: what the GEMM pipeline needs to know about an operand type and its major-ness. Each
// traits type names the element, the k-block one ring stage holds, the k of one instruction, the
// major-ness of A and B (the wgmma trans immediates), the shared-memory tile of each operand (its
// TMA boxes, descriptors and the step per instruction k) and a per-k-block promotion hook.
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/gemm/tile_geometry.cuh"
#include "mok/device/tensor_map.hpp"
#include "mok/device/tma.cuh"
#include "mok/device/wgmma.cuh"

namespace mok::kern {

// One operand's tile in a ring stage: `rows` rows along M (A) or N (B) by kBlockK, 128B-swizzled.
//  K-major:  row r is the 128 bytes at 128 r (kBlockK elements fill one swizzle span); one TMA
//            box of rows x span from a [rows, K] map.
//  MN-major: per 128-byte span of MN (kSpan elements) a block of kBlockK K rows of 128 bytes,
//            blocks kBlockK * 128 bytes apart (the descriptor's LBO); one TMA box of span x
//            kBlockK per block from a [K, MN] map.
template <class Element, dev::Major kMajor, int kBlockK>
struct OperandTile {
  static constexpr int kSpan = 128 / int(sizeof(Element));  // elements per swizzle span
  static_assert(kMajor == dev::Major::MN || kBlockK == kSpan,
                "K-major: a k-block is one 128-byte swizzle span");
  static_assert(kBlockK % 8 == 0, "whole 8-row swizzle atoms along K");
  static constexpr uint32_t kBlockBytes = kMajor == dev::Major::K ? 0u : uint32_t(kBlockK) * 128u;

  static constexpr uint32_t bytes(int rows) { return uint32_t(rows) * kBlockK * sizeof(Element); }
  // Offset of row r (a multiple of 64): a warpgroup's A rows, the up half of a gate/up B tile.
  static constexpr uint32_t row_offset(int r) {
    return kMajor == dev::Major::K ? uint32_t(r) * 128u : uint32_t(r / kSpan) * kBlockBytes;
  }
  // Offset of instruction k-step k (kInstrK elements each): along the row, or down the K rows.
  template <int kInstrK>
  static constexpr uint32_t k_offset(int k) {
    return kMajor == dev::Major::K ? uint32_t(k * kInstrK) * sizeof(Element)
                                   : uint32_t(k * kInstrK) * 128u;
  }
  __device__ static uint64_t desc(const uint8_t* tile) {
    return dev::smem_desc<kMajor>(dev::smem_addr(tile), kBlockBytes);
  }
  // Host side: the box rows of this operand's map (make_map_2d/3d's box_rows).
  static constexpr uint32_t box_rows(int rows) {
    return kMajor == dev::Major::K ? uint32_t(rows) : uint32_t(kBlockK);
  }
  // Device side: the k-block at K coordinate k of rows [mn0, mn0 + rows) into `tile`,
  // completing on `bar` (k: a column of a K-major map, a row of an MN-major one).
  template <int kRows>
  __device__ static void load_at(uint8_t* tile, const CUtensorMap* map, uint64_t* bar, int k,
                                 int mn0) {
    if constexpr (kMajor == dev::Major::K) {
      dev::tma_load_2d(tile, map, bar, k, mn0);
    } else {
      static_assert(kRows % kSpan == 0, "whole 128-byte spans along MN");
#pragma unroll
      for (int j = 0; j < kRows / kSpan; ++j)
        dev::tma_load_2d(tile + j * kBlockBytes, map, bar, mn0 + j * kSpan, k);
    }
  }
  // k-block kb of a map whose K starts at 0.
  template <int kRows>
  __device__ static void load_2d(uint8_t* tile, const CUtensorMap* map, uint64_t* bar, int kb,
                                 int mn0) {
    load_at<kRows>(tile, map, bar, kb * kBlockK, mn0);
  }
};

template <class Element_, dev::Dtype kDtype_, int kBlockK_, int kInstrK_, dev::Major kMajorA_,
          dev::Major kMajorB_>
struct MmaTraits {
  using Element = Element_;
  static constexpr dev::Dtype kDtype = kDtype_;  // of the operands' tensor maps
  static constexpr int kBlockK = kBlockK_, kInstrK = kInstrK_;
  static constexpr dev::Major kMajorA = kMajorA_, kMajorB = kMajorB_;
  static_assert(kBlockK % kInstrK == 0, "whole instructions per k-block");
  static_assert(kInstrK * sizeof(Element) == 32, "wgmma reads 32 bytes of K per instruction");
  using A = OperandTile<Element, kMajorA, kBlockK>;
  using B = OperandTile<Element, kMajorB, kBlockK>;
  static constexpr uint32_t kBytesScales = 0;  // per-stage scale tiles (none without scaling)
  // True: the mainloop hands each k-block's accumulators to promote (not in flight with the next).
  static constexpr bool kPromotes = false;

  template <int N>
  __device__ static void mma(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
    dev::wgmma<Element, N, kMajorA, kMajorB>(d, desc_a, desc_b, accumulate);
  }
  // After a k-block's wgmmas completed (ring stage `stage`, before its release): nothing, the
  // accumulators are final.
  template <int N>
  __device__ static void promote(float (&)[N / 2], uint32_t /*stage*/) {}
};

// The forward: activations [rows, K] and weights [N, K], both K contiguous.
struct Bf16KMajor
    : MmaTraits<__nv_bfloat16, dev::Dtype::bf16, 64, 16, dev::Major::K, dev::Major::K> {};
// dgrad: B stored [K, N] with N contiguous (W [H, I] read as [I, H]).
struct Bf16MnMajorB
    : MmaTraits<__nv_bfloat16, dev::Dtype::bf16, 64, 16, dev::Major::K, dev::Major::MN> {};
// wgrad: A stored [K, M] and B [K, N] (both token-major, K = an expert's rows).
struct Bf16MnMajorAB
    : MmaTraits<__nv_bfloat16, dev::Dtype::bf16, 64, 16, dev::Major::MN, dev::Major::MN> {};

// fp8_block's routed GEMMs: E4M3 activations [rows, K] and weights [N, K], K contiguous (8-bit
// wgmma reads nothing else). A k-block of 128 is one swizzle span and one scale block along K,
// and its stage has the BF16 forward's bytes, so both share one ring.
struct Fp8BlockKMajor
    : MmaTraits<__nv_fp8_e4m3, dev::Dtype::e4m3, 128, 32, dev::Major::K, dev::Major::K> {};

static_assert(Bf16KMajor::kBlockK == kBlockK, "the forward's k-block is Bf16KMajor's");

}  // namespace mok::kern
