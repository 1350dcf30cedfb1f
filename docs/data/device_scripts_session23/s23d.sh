#!/usr/bin/env bash
# Session 23, call 4 (one H200): the backward's dispatch CTAs (8 / 16 / 24 at I = 2048, the
# forward's count by default), dsv3 4k and qwen3-30b, two alternating rounds.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -40 /tmp/gpu_build.log; exit 1; }
echo "build $(el)s"
for r in 1 2; do for d in 0 16 32; do for sh in "dsv3 4096" "qwen3-30b 8192"; do set -- $sh
  timeout 60 build-gpu/mok bench --direction backward --preset $1 --tokens $2 --iterations 10 --dispatch-ctas $d > $OUT/bench_$1_d${d}_$r.txt 2>&1
  echo "round $r dispatch $d $1: $(grep "^| [dq]" $OUT/bench_$1_d${d}_$r.txt | cut -d'|' -f2,5,13,14) $(el)s"
done; done; done
