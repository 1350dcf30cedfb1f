#!/usr/bin/env bash
# Session 21, call 4 (one H200): 256-wide backward tiles where H, I and S allow. Build; the
# backward suite; mok bench --direction backward.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -40 /tmp/gpu_build.log; exit 1; }
echo "build $(el)s"
T=$OUT/tests.log; : > $T
run_test() { local n=$1; shift; timeout ${TL:-200} "$@" > /tmp/$n.log 2>&1; echo "$n rc=$? $(el)s" | tee -a $T; grep -E '^\[  PASSED|^\[  FAILED|ERROR SUMMARY' /tmp/$n.log | tee -a $T; grep -B3 -A14 "Failure" /tmp/$n.log | head -60 | tee -a $T; }
run_test backward build-gpu/tests/test_moe_backward_gpu
timeout 240 build-gpu/mok bench --direction backward --iterations 20 > $OUT/bench_backward.txt 2>&1; echo "bench backward rc=$? $(el)s"
tail -7 $OUT/bench_backward.txt
