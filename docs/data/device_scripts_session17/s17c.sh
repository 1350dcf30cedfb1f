#!/usr/bin/env bash
# Session 17, call 3 (one H200): the L2 -> SM bytes probe (493c71f): EP = 1 --graph 1 with
# --probe-loads none | half-a | gate-b | both, three alternating rounds.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -30 /tmp/gpu_build.log; exit 1; }
echo "build $(el)s"
for r in 1 2 3; do for v in none half-a gate-b both; do
  [ $(el) -gt 420 ] && break 2
  echo "### $v round $r" >> $OUT/bench_probe.log
  timeout 60 build-gpu/mok bench --preset all --iterations 20 --graph 1 --probe-loads $v >> $OUT/bench_probe.log 2>&1; echo "$v$r rc=$? $(el)s"
done; done
awk '/^### /{h=$0; n=0} /^\| (dsv3|mok-default|qwen3-30b|fine) \|/{n++; if (n<=5) {m=split($0,a,"|"); print h, a[2], a[3], a[5]}}' $OUT/bench_probe.log
