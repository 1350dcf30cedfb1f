#!/usr/bin/env bash
# Session 18, call 5 (one H200): the final code (device code = 1f67efd: session 16's production
# kernels, SASS-identical, plus the stage-probe instantiations): every GPU suite, `mok run`, and
# one `mok bench --preset all --graph 1 --stage-probes 1` round.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -30 /tmp/gpu_build.log; exit 1; }
echo "build $(el)s"
T=$OUT/tests.log; : > $T
run_test() { local n=$1; shift; timeout ${TL:-240} build-gpu/tests/$n "$@" > /tmp/$n.log 2>&1; echo "$n rc=$? $(el)s" | tee -a $T; grep -E '^\[  PASSED|^\[  FAILED|^\[  SKIPPED' /tmp/$n.log | tee -a $T; grep -B3 -A12 "Failure" /tmp/$n.log | head -40 >> $T; }
timeout 60 build-gpu/mok run --preset tiny > /tmp/run.log 2>&1; echo "mok run rc=$? $(el)s" | tee -a $T; tail -3 /tmp/run.log | tee -a $T
for n in test_primitives_gpu test_forward_gpu test_schedule_gpu test_formats_gpu test_grouped_gemm_gpu test_emulated_ep_gpu; do run_test $n; done
TL=200 run_test test_moe_forward_gpu
timeout 90 build-gpu/mok bench --preset all --iterations 20 --graph 1 --stage-probes 1 > $OUT/bench_final.log 2>&1; echo "bench rc=$? $(el)s"
sed -n '/^| shape/,/^$/p' $OUT/bench_final.log | head -8
sed -n '/^Stage probes/,/^$/p' $OUT/bench_final.log
