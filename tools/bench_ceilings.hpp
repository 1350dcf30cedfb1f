// The ceilings every benchmark row is measured against, re-measured right before each shape (the
// H200's clock moves under its power cap): dense BF16 GEMM (cuBLAS 8192^3) and HBM copy bandwidth.
#pragma once

namespace mok::tools {

struct Ceilings {
  double bf16_tflops = 0, hbm_tbps = 0;
  double sustained_bf16_tflops = 0;  // mok bench --sustain: the dense GEMM back to back
};

// On the current device (creates and destroys its own cuBLAS handle).
Ceilings measure_ceilings_now();

}  // namespace mok::tools
