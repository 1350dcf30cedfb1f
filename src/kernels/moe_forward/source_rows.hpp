// x rows quantized once on their source rank (fp8_block and mxfp8): what dispatch pulls, over
// NVLink under EP, instead of BF16 rows. Per token one row: its H E4M3 codes, then its scales
// (fp8_block: H / 128 FP32; mxfp8: H / 32 E8M0), padded to 16 bytes, so that a row is one run of
// 16-byte vectors: 1 + 1/128 (fp8_block) or 1 + 1/32 (mxfp8) bytes per element where BF16 moves 2.
// The layout of the rank buffers, EpForward's window, the quantizer and the dispatch copy.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "mok/common/host_device.hpp"

namespace mok::kern {

struct SourceRowLayout {
  int64_t hidden;       // codes: bytes [0, hidden) of a row
  int64_t scale_bytes;  // scales: bytes [hidden, hidden + scale_bytes)
  MOK_HD int64_t bytes() const { return hidden + (scale_bytes + 15) / 16 * 16; }
  MOK_HD int64_t vectors() const { return bytes() / 16; }
};

// mx: mxfp8's rows (one E8M0 byte per 32 columns), else fp8_block's (one FP32 per 128).
MOK_HD SourceRowLayout source_row_layout(bool mx, int64_t hidden) {
  return {hidden, mx ? hidden / 32 : hidden / 128 * 4};
}

// x [tokens, hidden] BF16 into rows [tokens, source_row_layout(mx, hidden).bytes()]: fp8_block's
// codes and scales of quantize_fp8_block(x, {1, 128}, ue8m0), or mxfp8's of quantize_mxfp8(x,
// {1, 32}, rceil), bit for bit. hidden % 128 == 0 (fp8_block) or % 32 == 0 (mxfp8); x and rows
// 16-byte aligned (cudaErrorInvalidValue otherwise). The scales' padding is left as it is.
cudaError_t quantize_source_rows(const __nv_bfloat16* x, int64_t tokens, int64_t hidden, bool mx,
                                 bool ue8m0, uint8_t* rows, cudaStream_t stream);

}  // namespace mok::kern
