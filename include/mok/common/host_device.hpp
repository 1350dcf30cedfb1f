// Marks code that compiles for both the host and the device: the layout, schedule and format math
// that the kernels, the CPU reference and the EP simulation share (design.md, invariant 6).
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MOK_HD __host__ __device__ __forceinline__
#else
#define MOK_HD inline
#endif

namespace mok {

MOK_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

MOK_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

MOK_HD bool is_finite_bits(uint32_t u) { return (u & 0x7F800000u) != 0x7F800000u; }
MOK_HD bool is_nan_bits(uint32_t u) { return (u & 0x7FFFFFFFu) > 0x7F800000u; }

// 2^k as FP32 for k in [-149, 127], subnormals included (ldexp without libm).
MOK_HD float exp2_int(int k) {
  if (k >= -126) return bits_float(uint32_t(k + 127) << 23);
  return bits_float(1u << (k + 149));
}

}  // namespace mok
