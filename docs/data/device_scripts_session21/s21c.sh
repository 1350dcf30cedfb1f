#!/usr/bin/env bash
# Session 21, call 3 (one H200): the backward with its tile table in shared memory, claims ahead,
# satisfied waits skipped and the dgrad-down epilogue's loads first. Build; forward digests; the
# backward suite; mok bench --direction backward; the forward bench (the engine changed).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -40 /tmp/gpu_build.log; exit 1; }
echo "build $(el)s"
timeout 150 build-gpu/forward_digests > $OUT/digests_head.txt 2>&1; echo "digests rc=$? $(el)s"
if cmp -s docs/data/session20/digests_e7fbf6e.txt $OUT/digests_head.txt; then echo "DIGESTS IDENTICAL to e7fbf6e"; else echo "DIGESTS DIFFER"; fi
T=$OUT/tests.log; : > $T
run_test() { local n=$1; shift; timeout ${TL:-200} "$@" > /tmp/$n.log 2>&1; echo "$n rc=$? $(el)s" | tee -a $T; grep -E '^\[  PASSED|^\[  FAILED|ERROR SUMMARY' /tmp/$n.log | tee -a $T; grep -B3 -A14 "Failure" /tmp/$n.log | head -60 >> $T; }
run_test backward build-gpu/tests/test_moe_backward_gpu
timeout 240 build-gpu/mok bench --direction backward --iterations 20 > $OUT/bench_backward.txt 2>&1; echo "bench backward rc=$? $(el)s"
tail -7 $OUT/bench_backward.txt
timeout 100 build-gpu/mok bench --preset all --iterations 20 --graph 1 > $OUT/bench_forward.txt 2>&1; echo "bench forward rc=$? $(el)s"
grep "^| [dmqf]" $OUT/bench_forward.txt | cut -d'|' -f2-6
