#!/usr/bin/env bash
# Session 20, call 1b: the base build (fixed) and the digests of base and HEAD; bench A/B rounds.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
(bash scripts/device_ab_base.sh build base > /tmp/base_path.txt 2>&1; echo "base build rc=$? $(el)s") &
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -30 /tmp/gpu_build.log; exit 1; }
echo "build $(el)s"
wait
tail -3 /tmp/base_path.txt
B=/tmp/base/b
timeout 150 $B/forward_digests > $OUT/digests_base.txt 2>&1; echo "digests base rc=$? $(el)s"
timeout 150 build-gpu/forward_digests > $OUT/digests_head.txt 2>&1; echo "digests head rc=$? $(el)s"
if cmp -s $OUT/digests_base.txt $OUT/digests_head.txt; then echo "DIGESTS IDENTICAL ($(wc -l < $OUT/digests_head.txt) lines, $(grep -c 'non-finite 0' $OUT/digests_head.txt) finite)"; else echo "DIGESTS DIFFER"; diff $OUT/digests_base.txt $OUT/digests_head.txt | head -30; fi
A=$OUT/bench_ab.log; : > $A
for r in 1 2 3; do for v in base head; do
  [ $(el) -gt 500 ] && break
  bin=$([ $v = base ] && echo $B/mok || echo build-gpu/mok)
  echo "### $v round $r" >> $A
  timeout 70 $bin bench --preset all --iterations 20 --graph 1 >> $A 2>&1; echo "bench $v $r rc=$? $(el)s"
done; done
awk '/^### /{h=$0; n=0} /^\| (dsv3|mok-default|qwen3-30b|fine) \| [0-9]+ \| [0-9]+ \|/{n++; if (n<=5) {m=split($0,a,"|"); print h, a[2], a[3], a[5]}}' $A
