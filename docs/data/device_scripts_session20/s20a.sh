#!/usr/bin/env bash
# Session 20, call 1 (one H200): the engine refactor's first check. Builds HEAD (every target) and
# the base b19c9ce (mok + forward_digests) side by side, compares the forward's output digests,
# runs every GPU suite, then one round of mok bench --graph 1 for each.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
(bash scripts/device_ab_base.sh build base > /tmp/base_path.txt 2>&1; echo "base build rc=$? $(el)s") &
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -30 /tmp/gpu_build.log; exit 1; }
echo "build $(el)s"
wait
cat /tmp/base_path.txt | tail -3
B=/tmp/base/b
timeout 150 $B/forward_digests > $OUT/digests_base.txt 2>&1; echo "digests base rc=$? $(el)s"
timeout 150 build-gpu/forward_digests > $OUT/digests_head.txt 2>&1; echo "digests head rc=$? $(el)s"
if cmp -s $OUT/digests_base.txt $OUT/digests_head.txt; then echo "DIGESTS IDENTICAL ($(wc -l < $OUT/digests_head.txt) lines)"; else echo "DIGESTS DIFFER"; diff $OUT/digests_base.txt $OUT/digests_head.txt | head -20; fi
grep -c "non-finite 0" $OUT/digests_head.txt
T=$OUT/tests.log; : > $T
run_test() { local n=$1; shift; timeout ${TL:-200} build-gpu/tests/$n "$@" > /tmp/$n.log 2>&1; echo "$n rc=$? $(el)s" | tee -a $T; grep -E '^\[  PASSED|^\[  FAILED|^\[  SKIPPED' /tmp/$n.log | tee -a $T; grep -B3 -A12 "Failure" /tmp/$n.log | head -40 >> $T; }
run_test test_gemm_traits_gpu
run_test test_primitives_gpu
run_test test_moe_forward_gpu
run_test test_emulated_ep_gpu
run_test test_ep_nccl_gpu
run_test test_forward_gpu
for n in test_schedule_gpu test_formats_gpu test_grouped_gemm_gpu; do run_test $n; done
timeout 30 build-gpu/mok run --preset tiny > /tmp/run.log 2>&1; echo "mok run rc=$? $(el)s"; tail -1 /tmp/run.log
A=$OUT/bench_ab.log; : > $A
for v in base head; do
  [ $(el) -gt 520 ] && break
  bin=$([ $v = base ] && echo $B/mok || echo build-gpu/mok)
  echo "### $v" >> $A
  timeout 70 $bin bench --preset all --iterations 20 --graph 1 >> $A 2>&1; echo "bench $v rc=$? $(el)s"
done
awk '/^### /{h=$0; n=0} /^\| (dsv3|mok-default|qwen3-30b|fine) \| [0-9]+ \| [0-9]+ \|/{n++; if (n<=5) {m=split($0,a,"|"); print h, a[2], a[3], a[5]}}' $A
grep -h "FAILED\|rc=[1-9]" $T | head -20
