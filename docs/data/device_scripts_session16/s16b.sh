#!/usr/bin/env bash
# Session 16, call 2 (one H200): head (PDL + two A maps) vs nopdl (two A maps only) vs base
# (f1a3283's device code, HEAD's tools): the fixed primitives test, EP = 1 with --graph 1 (three
# rounds), eager (one round), and --breakdown --graph of head and base (schedule alone).
set -uo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
(bash scripts/device_ab_base.sh build base > /tmp/base_build.out 2>&1; echo "base build rc=$?") &
(bash scripts/device_ab_base.sh build nopdl > /tmp/nopdl_build.out 2>&1; echo "nopdl build rc=$?") &
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -30 /tmp/gpu_build.log; exit 1; }
wait; tail -n 2 /tmp/base_build.out /tmp/nopdl_build.out
echo "builds $(el)s"
T=$OUT/tests.log; : > $T
timeout 60 build-gpu/tests/test_primitives_gpu > /tmp/prim.log 2>&1; echo "primitives rc=$? $(el)s" | tee -a $T
grep -E '^\[  PASSED|^\[  FAILED|^dependent launch|Failure' -A2 /tmp/prim.log | tee -a $T
bin() { case $1 in head) echo build-gpu/mok;; *) echo /tmp/$1/b/mok;; esac; }
for r in 1 2 3; do for v in head nopdl base; do
  echo "### $v graph round $r" >> $OUT/bench_graph.log
  timeout 60 $(bin $v) bench --preset all --iterations 20 --graph 1 >> $OUT/bench_graph.log 2>&1; echo "graph $v$r rc=$? $(el)s"
done; done
for v in head nopdl base; do
  echo "### $v eager" >> $OUT/bench_eager.log
  timeout 60 $(bin $v) bench --preset all --iterations 20 >> $OUT/bench_eager.log 2>&1; echo "eager $v rc=$? $(el)s"
done
for v in head base; do
  echo "### $v" >> $OUT/breakdown.log
  timeout 100 $(bin $v) bench --preset all --iterations 10 --breakdown 1 --graph 1 >> $OUT/breakdown.log 2>&1; echo "breakdown $v rc=$? $(el)s"
done
awk '/^### /{h=$0; n=0} /^\| (dsv3|mok-default|qwen3-30b|fine) \|/{n++; if (n<=5) {m=split($0,a,"|"); print h, a[2], a[3], a[5]}}' $OUT/bench_graph.log
awk '/^### /{h=$0; n=0} /^\| (dsv3|mok-default|qwen3-30b|fine) \|/{n++; if (n<=5) {m=split($0,a,"|"); print h, a[2], a[3], a[5]}}' $OUT/bench_eager.log
awk '/^### /{print; w=0} /Where the time goes/{w=1} /Waits inside/{w=0} w && /^\| (dsv3|mok|qwen|fine)/{print $0}' $OUT/breakdown.log | cut -d'|' -f1-3,5,9
