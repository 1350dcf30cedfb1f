#!/usr/bin/env bash
# Session 33, for the next device call (one GPU; carry [".device"] after
#   mkdir -p .device && cp -r /usr/src/googletest .device/googletest):
# what sessions 32-33 landed unrun, part 1: the nvfp4 and mxfp8 forwards (their GPU tests, the GPU
# quantizers they build on, unrun since session 29, and the BF16 forward's bits through the
# engine's new converter role: forward_digests against e7fbf6e's listing), then `mok bench
# --precision nvfp4|mxfp8` beside BF16 and PyTorch's FP8 forward (bench/torch_moe_fp8.py) on the
# standard shapes. Part 2 is s33b.sh.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
log=$OUT/s33a.log
source scripts/device_steps.sh
bash scripts/gpu_build.sh > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(el)s"
T=build-gpu/tests
run nvfp4 200 $T/test_nvfp4_gpu
grep -F "[ nvfp4_weights ]" /tmp/run.txt
run mxfp8 200 $T/test_mxfp8_gpu
grep -F "[ mxfp8 ]" /tmp/run.txt
run formats 150 $T/test_formats_gpu
build-gpu/forward_digests > $OUT/digests_s33a.txt 2>&1
diff -q $OUT/digests_s33a.txt docs/data/session20/digests_e7fbf6e.txt >/dev/null \
  && echo "DIGESTS IDENTICAL to e7fbf6e" || echo "DIGESTS DIFFER"
echo "before bench $(el)s"
for q in nvfp4 mxfp8; do
  timeout 120 build-gpu/mok bench --precision $q --iterations 20 \
    --json $OUT/bench_$q.json > $OUT/bench_$q.txt 2>&1
  echo "$q bench rc=$? $(el)s"
  grep '^|' $OUT/bench_$q.txt
done
[ $(el) -lt 480 ] && timeout $(( 580 - $(el) )) python3 bench/torch_moe_fp8.py --iterations 20 \
  > $OUT/torch_fp8.txt 2>&1
echo "torch fp8 rc=$? $(el)s"
grep '^|' $OUT/torch_fp8.txt
echo "end $(el)s"
