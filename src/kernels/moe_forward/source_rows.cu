// The source rows' quantizer (source_rows.hpp): the block rules of mok/formats/block_scale.hpp with
// the device pair conversion, as dispatch's fused quantizers apply them.
#include <algorithm>

#include "kernels/moe_forward/source_rows.hpp"
#include "mok/formats/fp8_block_device.cuh"
#include "mok/formats/mx_device.cuh"

namespace mok::kern {
namespace {

constexpr int kThreads = 256;

// One 16-byte vector of x (8 values) per lane, kGroup lanes per scale block (fp8_block: a
// half-warp per 128 columns; mxfp8: a quad per 32), the block's amax by shuffles: coalesced
// 16-byte loads and 8-byte code stores. Every lane of a warp runs the same trip count (the
// shuffles), with vectors past the end as zeros.
template <bool kMx>
__global__ void __launch_bounds__(kThreads)
    source_rows_kernel(const __nv_bfloat16* x, int64_t tokens, int64_t hidden, bool ue8m0,
                       uint8_t* rows) {
  constexpr int kGroup = kMx ? 4 : 16;
  static_assert(32 % kGroup == 0, "a scale block's lanes in one warp");
  const SourceRowLayout layout = source_row_layout(kMx, hidden);
  const int64_t row_vecs = hidden / 8, total = tokens * row_vecs;
  const int lane = int(threadIdx.x % 32);
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t warp0 = int64_t(blockIdx.x) * blockDim.x + (threadIdx.x - lane); warp0 < total;
       warp0 += stride) {
    const int64_t i = warp0 + lane;  // a scale block's vectors share a row (row_vecs % kGroup == 0)
    const int64_t token = i / row_vecs, vec = i % row_vecs;
    const uint4 v =
        i < total ? __ldg(reinterpret_cast<const uint4*>(x) + i) : make_uint4(0, 0, 0, 0);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    float f[8];
    fmt::BlockAmax a;
#pragma unroll
    for (int e = 0; e < 8; ++e)
      a.add(f[e] = bits_float(e % 2 ? w[e / 2] & 0xFFFF0000u : w[e / 2] << 16));
    a = fmt::reduce_block_amax(a, kGroup - 1);
    if (i >= total) continue;
    uint8_t* const row = rows + token * layout.bytes();
    const int64_t block = vec / kGroup;
    uint32_t codes[2];
    if constexpr (kMx) {
      const uint8_t s = fmt::mx_scale_rceil(a.amax);
#pragma unroll
      for (int h = 0; h < 2; ++h)
        codes[h] = uint32_t(fmt::mx_element_pair(f[4 * h], f[4 * h + 1], s)) |
                   uint32_t(fmt::mx_element_pair(f[4 * h + 2], f[4 * h + 3], s)) << 16;
      if (lane % kGroup == 0) row[hidden + block] = fmt::mx_stored_scale(a, s);
    } else {
      const fmt::Fp8BlockScale s = fmt::fp8_block_scale(a.amax, ue8m0);
#pragma unroll
      for (int h = 0; h < 2; ++h)
        codes[h] = uint32_t(fmt::fp8_block_pair(f[4 * h], f[4 * h + 1], s.encode)) |
                   uint32_t(fmt::fp8_block_pair(f[4 * h + 2], f[4 * h + 3], s.encode)) << 16;
      if (lane % kGroup == 0)
        reinterpret_cast<float*>(row + hidden)[block] = fmt::fp8_block_stored_scale(a, s);
    }
    reinterpret_cast<uint2*>(row)[vec] = make_uint2(codes[0], codes[1]);
  }
}

}  // namespace

cudaError_t quantize_source_rows(const __nv_bfloat16* x, int64_t tokens, int64_t hidden, bool mx,
                                 bool ue8m0, uint8_t* rows, cudaStream_t stream) {
  if (tokens < 0 || hidden <= 0 || hidden % (mx ? 32 : 128) != 0 ||
      reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(rows) % 16 != 0)
    return cudaErrorInvalidValue;
  const int64_t vecs = tokens * (hidden / 8);
  if (vecs == 0) return cudaSuccess;
  const int grid = int(std::min<int64_t>((vecs + kThreads - 1) / kThreads, 132 * 16));
  if (mx)
    source_rows_kernel<true><<<grid, kThreads, 0, stream>>>(x, tokens, hidden, ue8m0, rows);
  else
    source_rows_kernel<false><<<grid, kThreads, 0, stream>>>(x, tokens, hidden, ue8m0, rows);
  return cudaGetLastError();
}

}  // namespace mok::kern
