// Host API of the quantizers: whole 2-D tensors (row-major [rows, cols]) in blocks of
// block.rows x block.cols. Blocks at the right and bottom edges may be partial. Scales are stored
// row-major [ceil(rows / block.rows), ceil(cols / block.cols)].
#pragma once
#include <cstdint>
#include <vector>

#include "mok/formats/block_scale.hpp"

namespace mok {

struct BlockShape {
  int rows = 1;
  int cols = 32;
  friend bool operator==(const BlockShape&, const BlockShape&) = default;
};

enum class MxScaleRule { rceil, floor };

struct Mxfp8Tensor {
  int64_t rows = 0, cols = 0;
  BlockShape block;
  std::vector<uint8_t> data;    // E4M3 codes, [rows, cols]
  std::vector<uint8_t> scales;  // E8M0 codes
};

struct Nvfp4Tensor {
  int64_t rows = 0, cols = 0;  // cols even: two elements per byte, element 2i in the low nibble
  BlockShape block;
  std::vector<uint8_t> data;    // [rows, cols / 2]
  std::vector<uint8_t> scales;  // UE4M3 codes
  float global_amax = 0.0f;
  float s_dec = 1.0f;  // per-tensor factor
};

struct Fp8BlockTensor {
  int64_t rows = 0, cols = 0;
  BlockShape block;
  bool ue8m0 = false;         // scales are powers of two (RCEIL) when set
  std::vector<uint8_t> data;  // E4M3 codes
  std::vector<float> scales;  // FP32 decode scales
};

// Throws mok::Error for shapes a format does not allow (MXFP8: 1x32 or 32x1; NVFP4: 1x16 or 16x16;
// FP8 block: 1x128, 128x1 or 128x128) or an odd NVFP4 column count.
Mxfp8Tensor quantize_mxfp8(const float* x, int64_t rows, int64_t cols, BlockShape block,
                           MxScaleRule rule = MxScaleRule::rceil);
Nvfp4Tensor quantize_nvfp4(const float* x, int64_t rows, int64_t cols, BlockShape block);
Fp8BlockTensor quantize_fp8_block(const float* x, int64_t rows, int64_t cols, BlockShape block,
                                  bool ue8m0 = false);

// Throws mok::Error, before reading anything, for a block the format does not allow or data and
// scales that do not hold exactly the tensor's codes and its blocks' scales.
std::vector<float> dequantize(const Mxfp8Tensor& t);
std::vector<float> dequantize(const Nvfp4Tensor& t);
std::vector<float> dequantize(const Fp8BlockTensor& t);

// Element-wise conversions over arrays (for tests and tools).
void encode_e4m3(const float* x, uint8_t* out, int64_t n);
void encode_e5m2(const float* x, uint8_t* out, int64_t n);
void encode_e2m1(const float* x, uint8_t* out, int64_t n);
void encode_bf16(const float* x, uint16_t* out, int64_t n);

}  // namespace mok
