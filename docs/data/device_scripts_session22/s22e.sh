#!/usr/bin/env bash
# Session 22, call 5 (one H200): one-block tiles staged. Build HEAD and the base (46f3fe8,
# staged from two k-blocks); the backward suites (one GPU, emulated EP), forward digests, sanitizers; mok bench
# --direction backward A/B in alternating rounds, HEAD's with --breakdown.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -40 /tmp/gpu_build.log; exit 1; }
echo "build $(el)s"
BASE=$(bash scripts/device_ab_base.sh build base | tail -1); echo "base $BASE $(el)s"
timeout 150 build-gpu/forward_digests > $OUT/digests_head.txt 2>&1; echo "digests rc=$? $(el)s"
if cmp -s docs/data/session20/digests_e7fbf6e.txt $OUT/digests_head.txt; then echo "DIGESTS IDENTICAL to e7fbf6e"; else echo "DIGESTS DIFFER"; fi
T=$OUT/tests.log; : > $T
run_test() { local n=$1; shift; timeout ${TL:-200} "$@" > /tmp/$n.log 2>&1; echo "$n rc=$? $(el)s" | tee -a $T; grep -E '^\[  PASSED|^\[  FAILED|ERROR SUMMARY' /tmp/$n.log | tee -a $T; grep -B3 -A14 "Failure" /tmp/$n.log | head -40 | tee -a $T; }
run_test backward build-gpu/tests/test_moe_backward_gpu
run_test ep_backward build-gpu/tests/test_emulated_ep_backward_gpu
MOK_WAIT_SECONDS=120 TL=150 run_test racecheck_ep_backward compute-sanitizer --tool racecheck --error-exitcode 1 build-gpu/tests/test_emulated_ep_backward_gpu --gtest_filter='*TwoRanks*'
for r in 1 2; do
  timeout 100 $BASE bench --direction backward --iterations 10 > $OUT/bench_base_$r.txt 2>&1; echo "base bench rc=$? $(el)s"
  timeout 100 build-gpu/mok bench --direction backward --iterations 10 $([ $r = 2 ] && echo --breakdown 1) > $OUT/bench_head_$r.txt 2>&1; echo "head bench rc=$? $(el)s"
done
for f in $OUT/bench_base_1.txt $OUT/bench_head_1.txt $OUT/bench_base_2.txt $OUT/bench_head_2.txt; do echo "== $(basename $f)"; grep "^| [dmqf]" $f | head -5 | cut -d'|' -f2,3,5,8,13; done
sed -n '/Breakdown/,$p' $OUT/bench_head_2.txt | grep "^| [dmqf]"
