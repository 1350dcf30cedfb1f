#!/usr/bin/env bash
# Session 29, call 1 (one H200): what session 28 landed unrun: the timeline test and the other
# forward suites, the emulated backward (its poison check), the CLI contract's GPU branches,
# `mok trace` of dsv3 4k, and `mok bench --sweep 40 --seed 1` (issue 31/32's table).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(el)s"
log=$OUT/s29a.log
run() {  # name, timeout, command...
  local name=$1 limit=$2; shift 2
  local s=$(date +%s)
  timeout $limit "$@" > /tmp/run.txt 2>&1; local rc=$?
  echo "=== $name" >> $log; cat /tmp/run.txt >> $log
  printf '%-30s rc=%-3s %4ss %s\n' "$name" $rc $(( $(date +%s)-s )) \
    "$(grep -hoE '\[  PASSED  \] [0-9]+ tests?|\[  FAILED  \] [0-9]+ tests?' /tmp/run.txt | tr '\n' ' ')"
  [ $rc -ne 0 ] && grep -E "Failure|Expected|Which is|differs|exception|FAIL|error" /tmp/run.txt | head -8
}
T=build-gpu/tests
run moe_forward 150 $T/test_moe_forward_gpu
run emulated_bwd 120 $T/test_emulated_ep_backward_gpu
run cli 120 bash tests/cli/check_cli.sh build-gpu/mok
run trace_dsv3 60 build-gpu/mok trace --preset dsv3 --tokens 4096 --out $OUT/trace_dsv3_4096.json
tail -25 /tmp/run.txt
echo "before sweep $(el)s"
timeout $(( 570 - $(el) )) build-gpu/mok bench --sweep 40 --seed 1 --iterations 10 \
  --json $OUT/sweep40_seed1.json > $OUT/sweep40_seed1.txt 2>&1; echo "sweep rc=$? $(el)s"
tail -60 $OUT/sweep40_seed1.txt
