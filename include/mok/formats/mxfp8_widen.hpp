// MXFP8 weights as the Hopper GEMMs read them (no block-scaled MMA here): E4M3 codes and their
// 1x32 blocks' E8M0 scales are widened exactly to BF16 in shared memory on the way to BF16 wgmma
// (E4M3 * 2^k is exact in BF16 while it is a normal BF16 number: every block but those with
// scales 0-2, amax below ~1e-35, whose smallest values BF16's subnormals round), so the GEMM
// computes the MX values with FP32 accumulation, as a block-scaled MMA does up to summation
// order. Shared by the widening kernel code, the weight packer (gpu::Mxfp8Experts) and the host
// tests.
//
// Codes stay as the quantizer writes them ([N, K] bytes). Factors: per 64 of K (one ring stage),
// per row, its two blocks' 2^(scale - 127) as BF16 ([E][K / 64][N][2]).
#pragma once
#include <cstdint>

#include "mok/formats/codecs.hpp"

namespace mok::fmt {

constexpr int kMxfp8WidenK = 64;             // K per stage: 64 code bytes per row, 2 scale blocks
constexpr uint16_t kMxfp8WidenPre = 0x7B80;  // BF16 2^120: the first of the widening's products

// Bytes 2j and 2j + 1 of a word of four E4M3 codes as bf16x2 bits of value * 2^-120: the 7-bit
// magnitude lands in BF16's exponent and mantissa fields so that E4M3's exponent field becomes
// BF16's (E4M3 subnormals become BF16 subnormals, still value * 2^-120), the sign in bit 15.
// E4M3's NaN code is not kept: the quantizer writes it only into blocks whose scale is NaN.
MOK_HD uint32_t mxfp8_widen_pair_bits(uint32_t word, int j) {
  const uint32_t t = word >> (16 * j);
  const uint32_t spread = (t & 0xFFu) | ((t & 0xFF00u) << 8);  // byte 2j low, 2j + 1 high lane
  return ((spread << 4) & 0x07F007F0u) | ((spread << 8) & 0x80008000u);
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
