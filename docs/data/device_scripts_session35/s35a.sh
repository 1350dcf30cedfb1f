#!/usr/bin/env bash
# Session 35, one GPU (carry [".device"] after
#   mkdir -p .device && cp -r /usr/src/googletest .device/googletest):
# the nvfp4 backward's first run after the per-program staging slots (f2259f2), the nvfp4 forward,
# the BF16 forward's bits against e7fbf6e, the fp8_block and BF16 backwards; then, with the time
# left, the nvfp4 forward's wait profile (`--breakdown 1`) beside BF16.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
log=$OUT/s35a.log
source scripts/device_steps.sh
bash scripts/gpu_build.sh > $OUT/build.log 2>&1 || { grep -E "error|FAILED" -A3 $OUT/build.log | head -30; exit 1; }
echo "build $(el)s"
T=build-gpu/tests
run nvfp4_backward 150 $T/test_nvfp4_backward_gpu
grep -F "[ nvfp4 backward ]" /tmp/run.txt | head -12
run nvfp4 100 $T/test_nvfp4_gpu
build-gpu/forward_digests > $OUT/digests_s35a.txt 2>&1
diff -q $OUT/digests_s35a.txt docs/data/session20/digests_e7fbf6e.txt >/dev/null \
  && echo "DIGESTS IDENTICAL to e7fbf6e" || echo "DIGESTS DIFFER"
[ $(el) -lt 330 ] && run fp8_backward 120 $T/test_fp8_block_backward_gpu
[ $(el) -lt 380 ] && run moe_backward 110 $T/test_moe_backward_gpu
left=$(( 580 - $(el) ))
if [ $left -gt 60 ]; then
  timeout $left build-gpu/mok bench --precision nvfp4 --iterations 20 --breakdown 1 \
    --json $OUT/bench_nvfp4.json > $OUT/bench_nvfp4.txt 2>&1
  echo "nvfp4 forward bench rc=$? $(el)s"
  grep -E '^\||wait|starv' $OUT/bench_nvfp4.txt | head -40
fi
echo "end $(el)s"
