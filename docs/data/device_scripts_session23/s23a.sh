#!/usr/bin/env bash
# Session 23, call 1 (one H200): EpBackward (the NCCL EP backward; a one-rank group here) and the
# staged backward. Build; the new and touched GPU suites first, then every other one; memcheck of
# the one-rank NCCL backward; mok bench --direction backward (with the staged column) and
# PyTorch's autograd backward in the same call.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -40 /tmp/gpu_build.log; exit 1; }
echo "build $(el)s"
T=$OUT/tests.log; : > $T
run_test() { local n=$1; shift; timeout ${TL:-200} "$@" > $OUT/$n.log 2>&1; echo "$n rc=$? $(el)s" | tee -a $T; grep -E '^\[  PASSED|^\[  FAILED|^\[  SKIPPED|ERROR SUMMARY' $OUT/$n.log | tee -a $T; grep -B3 -A14 "Failure" $OUT/$n.log | head -40 | tee -a $T; }
first="test_ep_nccl_backward_gpu test_moe_backward_gpu test_ep_nccl_gpu test_emulated_ep_backward_gpu"
for n in $first; do run_test $n build-gpu/tests/$n; done
TL=150 run_test memcheck_ep_nccl_backward compute-sanitizer --tool memcheck build-gpu/tests/test_ep_nccl_backward_gpu --gtest_filter='*GraphReplay*:*Refused*'
timeout 200 build-gpu/mok bench --direction backward --iterations 20 > $OUT/bench_backward.txt 2>&1; echo "bench rc=$? $(el)s"
[ $(el) -lt 420 ] && { timeout 110 python3 bench/torch_moe_forward.py --direction backward --iterations 10 > $OUT/torch_backward.txt 2>&1; echo "torch backward rc=$? $(el)s"; }
for t in build-gpu/tests/test_*_gpu; do n=$(basename $t); case " $first test_backward_sampled_gpu test_moe_forward_gpu " in *" $n "*) continue;; esac; [ $(el) -lt 540 ] && run_test $n $t; done
echo "== tests"; cat $T | grep -v "^\[  PASSED" | head -40
echo "== bench"; grep "^| [dmqf]" $OUT/bench_backward.txt | head -5 | cut -d"|" -f2,3,5,6,8,10,14,15
tail -7 $OUT/torch_backward.txt 2>/dev/null
