#!/usr/bin/env bash
# Session 21, call 5 (one H200): wgrad m-tiles of 128 rows at every tile width (the 256-wide
# kernel of call 4 left half of dW_up and dW_down unwritten), the tile order's lag. Build; the
# backward suite; mok bench --direction backward at the automatic width and at 128.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -40 /tmp/gpu_build.log; exit 1; }
echo "build $(el)s"
T=$OUT/tests.log; : > $T
run_test() { local n=$1; shift; timeout ${TL:-200} "$@" > /tmp/$n.log 2>&1; echo "$n rc=$? $(el)s" | tee -a $T; grep -E '^\[  PASSED|^\[  FAILED|ERROR SUMMARY' /tmp/$n.log | tee -a $T; grep -B3 -A14 "Failure" /tmp/$n.log | head -40 | tee -a $T; }
run_test backward build-gpu/tests/test_moe_backward_gpu
for bn in 0 128; do
  timeout 200 build-gpu/mok bench --direction backward --iterations 20 --block-n $bn > $OUT/bench_backward_bn$bn.txt 2>&1; echo "bench backward block_n=$bn rc=$? $(el)s"
  grep "^| [dmqf]" $OUT/bench_backward_bn$bn.txt | cut -d'|' -f2-7,12,16
done
