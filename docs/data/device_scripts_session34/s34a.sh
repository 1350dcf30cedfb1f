#!/usr/bin/env bash
# Session 34, one GPU (carry [".device"] after
#   mkdir -p .device && cp -r /usr/src/googletest .device/googletest):
# the correctness of what session 34 wrote: the nvfp4 forward (the NaN factor's bits, its
# training form) and backward, the fp8_block backward on the shared test helpers, the BF16 backward after the engine's per-program converter
# warps, and the BF16 forward's bits (forward_digests against e7fbf6e's listing). s34b.sh times.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
log=$OUT/s34a.log
source scripts/device_steps.sh
bash scripts/gpu_build.sh > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(el)s"
T=build-gpu/tests
run nvfp4 200 $T/test_nvfp4_gpu
grep -F "[ nvfp4_weights ]" /tmp/run.txt | head -8
run nvfp4_backward 200 $T/test_nvfp4_backward_gpu
grep -F "[ nvfp4 backward ]" /tmp/run.txt | head -12
build-gpu/forward_digests > $OUT/digests_s34a.txt 2>&1
diff -q $OUT/digests_s34a.txt docs/data/session20/digests_e7fbf6e.txt >/dev/null \
  && echo "DIGESTS IDENTICAL to e7fbf6e" || echo "DIGESTS DIFFER"
[ $(el) -lt 420 ] && run fp8_backward 150 $T/test_fp8_block_backward_gpu
[ $(el) -lt 480 ] && run moe_backward 110 $T/test_moe_backward_gpu
echo "end $(el)s"
