// NVFP4 weights as the Hopper GEMMs read them (Hopper has no FP4 MMA): E2M1 codes and their
// 16x16 blocks' UE4M3 scales are widened exactly to BF16 in shared memory, on the way to BF16
// wgmma; each matrix's FP32 per-tensor factor is applied to the FP32 accumulators. Shared by the
// widening kernel code, the weight packer (gpu::Nvfp4Experts) and the host tests.
//
// The packed layout (per matrix [N, K], K contiguous, each 32-bit word 8 consecutive K elements):
// the even elements 0, 2, 4, 6 in nibbles 0-3 (bits 0-15) and the odd ones 1, 3, 5, 7 in nibbles
// 4-7, so that one shift puts elements 2j and 2j + 1 into the two 16-bit lanes of a bf16x2.
// Scales: per 64 of K (one ring stage), per 16 rows, the 4 blocks' factors S * 2^118 as BF16
// ([E][K / 64][N / 16][4]): a tile's stage is one contiguous TMA box. One product per element pair
// widens (its bits, value * 2^-126, times the factor): the widened tile holds E2M1 * S * 2^-8,
// exact in BF16 (at most 6 significant bits, 2^-18 to 10.5), and the epilogues multiply the FP32
// accumulators by 2^8 with the per-tensor factor. S * 2^126 would overflow BF16 above S = 4.
#pragma once
#include <cstdint>

#include "mok/formats/codecs.hpp"

namespace mok::fmt {

constexpr int kNvfp4WidenK = 64;              // K per stage: 32 code bytes per row, 4 scale blocks
constexpr float kNvfp4WidenUnscale = 256.0f;  // the widened tile's 2^-8, undone in the epilogue

// Nibble (0-7) of a packed word that holds element k (0-7) of its 8.
MOK_HD int nvfp4_packed_nibble(int k) { return (k & 1) ? 4 + k / 2 : k / 2; }

// Elements 2j and 2j + 1 of a packed word as bf16x2 bits of value * 2^-126: each magnitude's
// exponent and mantissa bits (e, m) land in a BF16 exponent field e and mantissa bit m, which is
// exactly E2M1 * 2^-126 (e = 0 gives BF16 subnormals: 0 and 0.5 * 2^-126), the sign in bit 15.
MOK_HD uint32_t nvfp4_widen_pair_bits(uint32_t word, int j) {
  const uint32_t v = word >> (4 * j);
  return ((v << 6) & 0x01C001C0u) | ((v << 12) & 0x80008000u);
}

// The BF16 factor of a block: its UE4M3 scale times 2^118, exact (a 4-bit significand and an
// exponent in [-9, 8] + 118); a NaN scale (a block that held a non-finite value) gives BF16's
// canonical NaN on host and device alike (the GPU's NaN product carries another payload).
MOK_HD uint16_t nvfp4_widen_factor(uint8_t ue4m3_scale) {
  if ((ue4m3_scale & 0x7F) == 0x7F) return 0x7FC0;
  return bf16_from_float(ue4m3_to_float(ue4m3_scale) * 0x1p118f);
}

// Byte offset of the factor of (row r, stage k-block kb, 16-column block c) in a matrix of
// `rows` rows (a multiple of 16).
MOK_HD int64_t nvfp4_widen_factor_offset(int64_t rows, int64_t r, int64_t kb, int c) {
  return ((kb * (rows / 16) + r / 16) * 4 + c) * 2;
}

}  // namespace mok::fmt
