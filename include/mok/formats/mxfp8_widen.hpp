// MXFP8 weights as the Hopper GEMMs read them (no block-scaled MMA here): E4M3 codes and their
// 1x32 blocks' E8M0 scales are widened exactly to BF16 in shared memory on the way to BF16 wgmma
// (E4M3 * 2^k is exact in BF16 while it is a normal BF16 number: every block but those with
// scales 0-2, amax below ~1e-35, whose smallest values BF16's subnormals round), so the GEMM
// computes the MX values with FP32 accumulation, as a block-scaled MMA does up to summation
// order. Shared by the widening kernel code, the weight packer (gpu::Mxfp8Experts) and the host
// tests.
//
// Codes: [N, K] bytes, each 32-bit word of four (K elements k0-k3) in mxfp8_packed_word's order,
// so that its two bf16x2 pairs take one and four instructions (a byte per element would take
// about eleven); the GPU weight quantizer writes them so (quantize_mxfp8_weights_packed).
// Factors: per 64 of K (one ring stage), per row, its two blocks' 2^(scale - 127) as BF16
// ([E][K / 64][N][2]).
#pragma once
#include <cstdint>

#include "mok/formats/codecs.hpp"

namespace mok::fmt {

constexpr int kMxfp8WidenK = 64;             // K per stage: 64 code bytes per row, 2 scale blocks
constexpr uint16_t kMxfp8WidenPre = 0x7B80;  // BF16 2^120: the first of the widening's products

// A word of four E4M3 codes (byte i: element k_i) in the widening's order. Per 16-bit lane l
// (elements k_l and k_{2+l}): bits 4-10 and 15 hold k_l's magnitude and sign where its BF16 bits
// want them; bits 0-3, 12-14 and 11 hold k_{2+l}'s magnitude (low four, high three) and sign, one
// shift left (0-3 and 11) and one right (12-14) from there.
MOK_HD uint32_t mxfp8_packed_word(uint32_t codes) {
  uint32_t out = 0;
  for (int l = 0; l < 2; ++l) {
    const uint32_t a = (codes >> (8 * l)) & 0xFFu, b = (codes >> (8 * (2 + l))) & 0xFFu;
    const uint32_t lane =
        (a & 0x7Fu) << 4 | (a & 0x80u) << 8 | (b & 0x0Fu) | (b & 0x70u) << 8 | (b & 0x80u) << 4;
    out |= lane << (16 * l);
  }
  return out;
}

// Elements k_{2j} and k_{2j+1} of a packed word as bf16x2 bits of value * 2^-120: the 7-bit
// magnitude lands in BF16's exponent and mantissa fields so that E4M3's exponent field becomes
// BF16's (E4M3 subnormals become BF16 subnormals, still value * 2^-120), the sign in bit 15.
// E4M3's NaN code is not kept: the quantizer writes it only into blocks whose scale is NaN.
MOK_HD uint32_t mxfp8_widen_pair_bits(uint32_t word, int j) {
  if (j == 0) return word & 0x87F087F0u;
  return ((word << 4) & 0x80F080F0u) | ((word >> 4) & 0x07000700u);
}

// The BF16 factor of a block: 2^(scale - 127), exact (scale 0 is the BF16 subnormal 2^-127); the
// NaN scale (0xFF) stays NaN.
MOK_HD uint16_t mxfp8_widen_factor(uint8_t e8m0_scale) {
  return bf16_from_float(e8m0_to_float(e8m0_scale));
}

// Byte offset of the factor of (row r, stage k-block kb, 32-column block b) in a matrix of
// `rows` rows.
MOK_HD int64_t mxfp8_widen_factor_offset(int64_t rows, int64_t r, int64_t kb, int b) {
  return ((kb * rows + r) * 2 + b) * 2;
}

}  // namespace mok::fmt
