// wgmma (warpgroup MMA, sm_90a): fences, groups, shared-memory descriptors, and
// wgmma<Element, N, MajorA, MajorB>, m64nNk16 (BF16) or m64nNk32 (FP8 E4M3) with FP32 accumulators.
// A warpgroup (4 consecutive warps from a warp index divisible by 4) issues each one; operands are
// 128B-swizzled shared-memory tiles, K-major or MN-major (hopper-gemm.md, 6).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

namespace mok::dev {

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
// At most N committed groups still pending.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  static_assert(N >= 0 && N <= 7, "wgmma.wait_group takes 0..7");
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// Keeps the compiler from moving accumulator reads above a wgmma wait.
template <int N>
__device__ __forceinline__ void fence_accumulators(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Which dimension is contiguous in a shared-memory operand; the value is the instruction's
// imm-trans-a / imm-trans-b (PTX ISA 9.7.15.5.1.2: 0 = K-major, 1 = M- or N-major).
enum class Major : int { K = 0, MN = 1 };
enum class Swizzle : int { B128 = 1 };  // the descriptor's layout-type field

// Descriptor of a 128B-swizzled tile from a 1024-byte aligned shared address (PTX ISA
// 9.7.15.5.1.2.1, canonical layouts; fields in 16-byte units, base offset 0):
//  K-major,  ((8,m),(T,2k)):((8T,SBO),(1,T)): rows of 128 bytes along K, 8-row groups SBO = 1024 B
//            apart; LBO is unused with a swizzle (1).
//  MN-major, ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)): per K row 128 bytes along MN, 8 K rows per
//            1024-byte swizzle atom; SBO = 1024 B between atoms along K, LBO = `mn_atom_stride`
//            bytes between the 128-byte-wide atoms along MN (unused when the instruction reads
//            one).
template <Major kMajor, Swizzle kSwizzle = Swizzle::B128>
__host__ __device__ constexpr uint64_t smem_desc(uint32_t smem_address,
                                                 uint32_t mn_atom_stride = 0) {
  static_assert(kSwizzle == Swizzle::B128, "only the 128-byte swizzle");
  const uint64_t lbo = kMajor == Major::K ? 1u : (mn_atom_stride & 0x3FFFFu) >> 4;
  return uint64_t((smem_address & 0x3FFFFu) >> 4) | (lbo << 16) | (64ull << 32) |
         (uint64_t(kSwizzle) << 62);
}
// Moving a descriptor by `bytes` (a multiple of 16, staying below 256 KB): along K (K-major: 32 B
// per BF16 k16 step inside a row; MN-major: 2048 B, two atoms) or to another 1024-aligned tile.
__device__ __forceinline__ uint64_t smem_desc_advance(uint64_t desc, uint32_t bytes) {
  return desc + (bytes >> 4);
}

// The accumulator operands: "%0, %1, ..." in the instruction text and "+f"(d[i]) constraints,
// written out by decade (the text needs decimal literals).
#define MOK_WG_S0(n) "%" #n
#define MOK_WG_S(n) ", %" #n
#define MOK_WG_O0(n) "+f"(d[n])
#define MOK_WG_O(n) , "+f"(d[n])
#define MOK_WG_D2(M, x) M(x##0) M(x##1)
#define MOK_WG_D4(M, x) MOK_WG_D2(M, x) M(x##2) M(x##3)
#define MOK_WG_D6(M, x) MOK_WG_D4(M, x) M(x##4) M(x##5)
#define MOK_WG_D8(M, x) MOK_WG_D6(M, x) M(x##6) M(x##7)
#define MOK_WG_D10(M, x) MOK_WG_D8(M, x) M(x##8) M(x##9)
#define MOK_WG_FIRST(M0, M) M0(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9)
#define MOK_WG_ACC32(M0, M) MOK_WG_FIRST(M0, M) MOK_WG_D10(M, 1) MOK_WG_D10(M, 2) MOK_WG_D2(M, 3)
// clang-format 14 does not lay these continuation lines out stably.
// clang-format off
#define MOK_WG_ACC64(M0, M) \
  MOK_WG_FIRST(M0, M)       \
  MOK_WG_D10(M, 1)          \
  MOK_WG_D10(M, 2) MOK_WG_D10(M, 3) MOK_WG_D10(M, 4) MOK_WG_D10(M, 5) MOK_WG_D4(M, 6)
#define MOK_WG_ACC96(M0, M)                                                            \
  MOK_WG_FIRST(M0, M)                                                                  \
  MOK_WG_D10(M, 1)                                                                     \
  MOK_WG_D10(M, 2) MOK_WG_D10(M, 3) MOK_WG_D10(M, 4) MOK_WG_D10(M, 5) MOK_WG_D10(M, 6) \
      MOK_WG_D10(M, 7) MOK_WG_D10(M, 8) MOK_WG_D6(M, 9)
#define MOK_WG_ACC128(M0, M)                                                                 \
  MOK_WG_FIRST(M0, M)                                                                        \
  MOK_WG_D10(M, 1)                                                                           \
  MOK_WG_D10(M, 2) MOK_WG_D10(M, 3) MOK_WG_D10(M, 4) MOK_WG_D10(M, 5) MOK_WG_D10(M, 6)       \
      MOK_WG_D10(M, 7) MOK_WG_D10(M, 8) MOK_WG_D10(M, 9) MOK_WG_D10(M, 10) MOK_WG_D10(M, 11) \
          MOK_WG_D8(M, 12)
// clang-format on

// One instruction: SHAPE_TYPES names it, ACC is its accumulator list, DA / DB / P the operand
// numbers of the descriptors and of the scale-d flag (after the accumulators), TAIL the
// immediates after scale-d (scale-a, scale-b and, for 16-bit types, the trans-a / trans-b
// operands %P+1 / %P+2).
#define MOK_WGMMA_ASM(SHAPE_TYPES, ACC, DA, DB, P, TAIL, ...)                         \
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %" P                               \
               ", 0;\n"                                                               \
               " wgmma.mma_async.sync.aligned." SHAPE_TYPES                           \
               " {" ACC(MOK_WG_S0, MOK_WG_S) "}, %" DA ", %" DB ", p, " TAIL ";\n}\n" \
               : ACC(MOK_WG_O0, MOK_WG_O)                                             \
               : "l"(desc_a), "l"(desc_b), "r"(uint32_t(accumulate))__VA_ARGS__       \
               : "memory")
#define MOK_WGMMA_BF16(N, ACC, DA, DB, P, TA, TB)                                       \
  MOK_WGMMA_ASM("m64n" #N "k16.f32.bf16.bf16", ACC, DA, DB, P, "1, 1, %" TA ", %" TB, , \
                "n"(int(kMajorA)), "n"(int(kMajorB)))
#define MOK_WGMMA_E4M3(N, ACC, DA, DB, P) \
  MOK_WGMMA_ASM("m64n" #N "k32.f32.e4m3.e4m3", ACC, DA, DB, P, "1, 1")

// D[64xN] (+)= A[64xK] * B[NxK]^T with FP32 accumulators; K = 16 (BF16) or 32 (E4M3) per
// instruction; accumulate = false overwrites. Thread layout of d: warp w = (tid / 32) % 4, lane l,
// for j in 0..N/8-1: d[4j], d[4j+1] -> row 16w + l/4, cols 8j + 2(l%4) + {0, 1}; d[4j+2], d[4j+3]
// -> row + 8.
template <class Element, int N, Major kMajorA = Major::K, Major kMajorB = Major::K>
__device__ __forceinline__ void wgmma(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b,
                                      bool accumulate) {
  static_assert(N == 64 || N == 128 || N == 192 || N == 256, "m64n64, n128, n192 or n256");
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) {
    if constexpr (N == 64)
      MOK_WGMMA_BF16(64, MOK_WG_ACC32, "32", "33", "34", "35", "36");
    else if constexpr (N == 128)
      MOK_WGMMA_BF16(128, MOK_WG_ACC64, "64", "65", "66", "67", "68");
    else if constexpr (N == 192)
      MOK_WGMMA_BF16(192, MOK_WG_ACC96, "96", "97", "98", "99", "100");
    else
      MOK_WGMMA_BF16(256, MOK_WG_ACC128, "128", "129", "130", "131", "132");
  } else {
    static_assert(std::is_same_v<Element, __nv_fp8_e4m3>, "BF16 or FP8 E4M3 operands");
    static_assert(kMajorA == Major::K && kMajorB == Major::K,
                  "8-bit wgmma reads K-major operands only (no imm-trans)");
    if constexpr (N == 64)
      MOK_WGMMA_E4M3(64, MOK_WG_ACC32, "32", "33", "34");
    else if constexpr (N == 128)
      MOK_WGMMA_E4M3(128, MOK_WG_ACC64, "64", "65", "66");
    else if constexpr (N == 192)
      MOK_WGMMA_E4M3(192, MOK_WG_ACC96, "96", "97", "98");
    else
      MOK_WGMMA_E4M3(256, MOK_WG_ACC128, "128", "129", "130");
  }
}

#undef MOK_WGMMA_E4M3
#undef MOK_WGMMA_BF16
#undef MOK_WGMMA_ASM
#undef MOK_WG_ACC128
#undef MOK_WG_ACC96
#undef MOK_WG_ACC64
#undef MOK_WG_ACC32
#undef MOK_WG_FIRST
#undef MOK_WG_D10
#undef MOK_WG_D8
#undef MOK_WG_D6
#undef MOK_WG_D4
#undef MOK_WG_D2
#undef MOK_WG_O
#undef MOK_WG_O0
#undef MOK_WG_S
#undef MOK_WG_S0

}  // namespace mok::dev
