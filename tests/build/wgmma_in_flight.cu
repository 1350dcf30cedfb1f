// The input of check_nvcc_guard.sh: a loop of one m64n64k16 wgmma per step. Built as it is, ptxas
// pipelines it; with -DTOUCH_IN_FLIGHT an accumulator is written while its wgmma is in flight,
// and ptxas serialises the loop and injects waits (C7511, C7517, C7519), which the guard refuses.
#include <cstdint>

__device__ __forceinline__ void mma_m64n64k16(float (&d)[32], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, "
      "%8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, "
      "%26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b));
}

__global__ void wgmma_loop(float* out, uint64_t a, uint64_t b, int steps) {
  float d[32] = {};
  for (int j = 0; j < steps; ++j) {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    mma_m64n64k16(d, a + j, b + j);
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#ifdef TOUCH_IN_FLIGHT
    d[j & 31] += 1.0f;
#endif
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  }
  for (int i = 0; i < 32; ++i) out[threadIdx.x * 32 + i] = d[i];
}
