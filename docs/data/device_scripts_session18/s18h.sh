#!/usr/bin/env bash
# Session 18, call 8 (one H200): the bench after the review mends (9067969: one median helper, one wait-profile row printer): graph and
# eager timing, stage probes, a breakdown (which times the schedule alone through the same runner).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -30 /tmp/gpu_build.log; exit 1; }
echo "build $(el)s"
B=$OUT/bench_runner.log
timeout 60 build-gpu/mok bench --preset qwen3-30b --iterations 10 --graph 1 --stage-probes 1 >> $B 2>&1; echo "graph probes rc=$? $(el)s"
timeout 60 build-gpu/mok bench --preset fine --iterations 10 --stage-probes 1 >> $B 2>&1; echo "eager probes rc=$? $(el)s"
timeout 60 build-gpu/mok bench --preset fine --iterations 10 --graph 1 --breakdown 1 >> $B 2>&1; echo "graph breakdown rc=$? $(el)s"
grep -E "^\| (qwen3-30b|fine) \| [0-9]+ \|" $B
