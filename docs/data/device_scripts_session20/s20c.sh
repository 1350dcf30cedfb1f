#!/usr/bin/env bash
# Session 20, call 2 (one H200): the refactor's final check. HEAD (every target) and the base
# b19c9ce (mok + forward_digests) side by side: output digests, every GPU suite, memcheck of the
# training forward, three alternating rounds of mok bench --graph 1, the stage probes from the CLI.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
(bash scripts/device_ab_base.sh build base > /tmp/base_path.txt 2>&1; echo "base build rc=$? $(el)s") &
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -30 /tmp/gpu_build.log; exit 1; }
echo "build $(el)s"
wait
tail -2 /tmp/base_path.txt
B=/tmp/base/b
timeout 150 $B/forward_digests > $OUT/digests_base.txt 2>&1; echo "digests base rc=$? $(el)s"
timeout 150 build-gpu/forward_digests > $OUT/digests_head.txt 2>&1; echo "digests head rc=$? $(el)s"
if cmp -s $OUT/digests_base.txt $OUT/digests_head.txt; then echo "DIGESTS IDENTICAL ($(wc -l < $OUT/digests_head.txt) lines, $(grep -c 'non-finite 0' $OUT/digests_head.txt) finite)"; else echo "DIGESTS DIFFER"; diff $OUT/digests_base.txt $OUT/digests_head.txt | head -30; fi
T=$OUT/tests.log; : > $T
run_test() { local n=$1; shift; timeout ${TL:-200} "$@" > /tmp/$n.log 2>&1; echo "$n rc=$? $(el)s" | tee -a $T; grep -E '^\[  PASSED|^\[  FAILED|^\[  SKIPPED|ERROR SUMMARY' /tmp/$n.log | tee -a $T; grep -B3 -A12 "Failure" /tmp/$n.log | head -40 >> $T; }
for t in build-gpu/tests/test_*_gpu; do n=$(basename $t); run_test $n $t; done
MOK_WAIT_SECONDS=120 run_test memcheck_training compute-sanitizer --tool memcheck --error-exitcode 1 build-gpu/tests/test_moe_forward_gpu --gtest_filter='*Training*:*Rejects*:*StageProbes*'
timeout 30 build-gpu/mok run --preset tiny > /tmp/run.log 2>&1; echo "mok run rc=$? $(el)s"; tail -1 /tmp/run.log
A=$OUT/bench_ab.log; : > $A
for r in 1 2 3; do for v in base head; do
  [ $(el) -gt 520 ] && break
  bin=$([ $v = base ] && echo $B/mok || echo build-gpu/mok)
  echo "### $v round $r" >> $A
  timeout 70 $bin bench --preset all --iterations 20 --graph 1 >> $A 2>&1; echo "bench $v $r rc=$? $(el)s"
done; done
[ $(el) -lt 540 ] && { timeout 50 build-gpu/mok bench --preset dsv3 --tokens 4096 --iterations 10 --graph 1 --stage-probes 1 > $OUT/probes.log 2>&1; echo "probes rc=$? $(el)s"; }
awk '/^### /{h=$0; n=0} /^\| (dsv3|mok-default|qwen3-30b|fine) \| [0-9]+ \| [0-9]+ \|/{n++; if (n<=5) {m=split($0,a,"|"); print h, a[2], a[3], a[5]}}' $A
grep -h "FAILED\|rc=[1-9]" $T | head -20
