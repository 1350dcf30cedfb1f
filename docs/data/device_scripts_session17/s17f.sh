#!/usr/bin/env bash
# Session 17, call 6 (one H200), e602eb7 (07c888f's device code): qwen3-30b at EP = 1 (dispatch
# copy) with 8, 12, 16 (default) and 24 dispatch CTAs, --graph 1, three alternating rounds.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -30 /tmp/gpu_build.log; exit 1; }
echo "build $(el)s"
for r in 1 2 3; do for n in 8 12 16 24; do
  [ $(el) -gt 300 ] && break 2
  echo "### dispatch-ctas $n round $r" >> $OUT/bench.log
  timeout 60 build-gpu/mok bench --preset qwen3-30b --iterations 20 --graph 1 --dispatch-ctas $n >> $OUT/bench.log 2>&1; echo "n$n r$r rc=$? $(el)s"
done; done
awk '/^### /{h=$0} /^\| qwen3-30b \|/{m=split($0,a,"|"); print h, a[2], a[3], a[5], a[15]}' $OUT/bench.log
