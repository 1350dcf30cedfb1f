#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <string>

#include "mok/device/tensor_map.hpp"
#include "mok/error.hpp"

namespace mok::dev {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000,
                                                           cudaEnableDefault, &q);
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || p == nullptr) {
      throw Error(ErrorCode::unsupported,
                  std::string("cuTensorMapEncodeTiled is not available from the driver (") +
                      cudaGetErrorString(e) + ")");
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

CUtensorMapDataType data_type(Dtype t) {
  switch (t) {
    case Dtype::bf16:
      return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    case Dtype::e4m3:
      return CU_TENSOR_MAP_DATA_TYPE_UINT8;  // TMA moves bytes; the MMA reads them as e4m3
    case Dtype::fp32:
      return CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  }
  throw Error(ErrorCode::invalid_argument, "unknown tensor map element type");
}

CUtensorMap encode(Dtype dtype, const void* base, cuuint32_t rank, const cuuint64_t* dims,
                   const cuuint64_t* strides, const cuuint32_t* box,
                   CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B) {
  CUtensorMap map{};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult r =
      encoder()(&map, data_type(dtype), rank, const_cast<void*>(base), dims, strides, box,
                element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    throw Error(ErrorCode::invalid_argument,
                "cuTensorMapEncodeTiled failed with CUresult " + std::to_string(int(r)) +
                    " (base and row strides must be 16-byte aligned, boxes at most 256 rows)");
  }
  return map;
}

}  // namespace

CUtensorMap make_map_2d(Dtype dtype, const void* base, uint64_t rows, uint64_t cols,
                        uint64_t row_stride_elems, uint32_t box_rows) {
  const uint64_t bytes = dtype_bytes(dtype);
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {row_stride_elems * bytes};
  const cuuint32_t box[2] = {box_cols(dtype), box_rows};
  return encode(dtype, base, 2, dims, strides, box);
}

CUtensorMap make_map_3d(Dtype dtype, const void* base, uint64_t batches, uint64_t rows,
                        uint64_t cols, uint32_t box_rows) {
  const uint64_t bytes = dtype_bytes(dtype);
  const cuuint64_t dims[3] = {cols, rows, batches};
  const cuuint64_t strides[2] = {cols * bytes, rows * cols * bytes};
  const cuuint32_t box[3] = {box_cols(dtype), box_rows, 1};
  return encode(dtype, base, 3, dims, strides, box);
}

CUtensorMap make_byte_map_3d(const void* base, uint64_t batches, uint64_t rows, uint64_t row_bytes,
                             uint32_t box_bytes, uint32_t box_rows) {
  const cuuint64_t dims[3] = {row_bytes, rows, batches};
  const cuuint64_t strides[2] = {row_bytes, rows * row_bytes};
  const cuuint32_t box[3] = {box_bytes, box_rows, 1};
  return encode(Dtype::e4m3, base, 3, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_NONE);
}

}  // namespace mok::dev
