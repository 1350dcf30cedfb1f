#!/usr/bin/env bash
# Session 35, one GPU, after s35c.sh on the same machine: the branchless E2M1 encoder: the GPU
# quantizers' bits (test_formats_gpu), the nvfp4 suites, and the nvfp4 weight quantizer's time.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
log=$OUT/s35d.log
source scripts/device_steps.sh
cmake --build build-gpu -j 16 --target test_formats_gpu test_nvfp4_gpu mok > $OUT/build.log 2>&1 ||
  { grep -E "error|FAILED" -A3 $OUT/build.log | head -30; exit 1; }
echo "build $(el)s"
run formats 60 build-gpu/tests/test_formats_gpu
run nvfp4 100 build-gpu/tests/test_nvfp4_gpu
for preset in qwen3-30b dsv3; do
  timeout 100 build-gpu/mok bench --precision nvfp4 --preset $preset --iterations 10 2>&1 | grep '^|' | grep -vE '^\|---'
done
echo "end $(el)s"
