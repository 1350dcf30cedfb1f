// Host side of TMA: encoding tensor maps for operands read in 128-byte-wide boxes with the 128B
// swizzle, through the driver entry point (no -lcuda).
#pragma once
#include <cuda.h>

#include <cstdint>

namespace mok::dev {

// The element type of a map; a box row is 128 bytes of it (one swizzle span).
enum class Dtype : int { bf16, e4m3, fp32 };
constexpr uint32_t dtype_bytes(Dtype t) {
  return t == Dtype::fp32 ? 4u : t == Dtype::bf16 ? 2u : 1u;
}
constexpr uint32_t box_cols(Dtype t) { return 128u / dtype_bytes(t); }

// A row-major [rows, cols] matrix (cols contiguous, row stride `row_stride_elems`), read in boxes
// of box_rows x box_cols(dtype). Throws mok::Error on failure.
CUtensorMap make_map_2d(Dtype dtype, const void* base, uint64_t rows, uint64_t cols,
                        uint64_t row_stride_elems, uint32_t box_rows);

// [batches, rows, cols] (experts' weights), boxes of box_rows x box_cols(dtype) in one batch.
CUtensorMap make_map_3d(Dtype dtype, const void* base, uint64_t batches, uint64_t rows,
                        uint64_t cols, uint32_t box_rows);

// Bytes [batches, rows, row_bytes], boxes of box_rows x box_bytes in one batch, unswizzled (packed
// codes and scales a kernel unpacks itself). row_bytes and box_bytes multiples of 16.
CUtensorMap make_byte_map_3d(const void* base, uint64_t batches, uint64_t rows, uint64_t row_bytes,
                             uint32_t box_bytes, uint32_t box_rows);

}  // namespace mok::dev
