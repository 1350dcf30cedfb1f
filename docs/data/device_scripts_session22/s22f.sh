#!/usr/bin/env bash
# Session 22, call 6 (one H200): the closing check. Build; forward digests against session 20's;
# every GPU suite (the new sampled standard-shape check included); mok bench --direction backward
# and PyTorch's autograd backward in the same call.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -40 /tmp/gpu_build.log; exit 1; }
echo "build $(el)s"
timeout 150 build-gpu/forward_digests > $OUT/digests_head.txt 2>&1; echo "digests rc=$? $(el)s"
if cmp -s docs/data/session20/digests_e7fbf6e.txt $OUT/digests_head.txt; then echo "DIGESTS IDENTICAL to e7fbf6e"; else echo "DIGESTS DIFFER"; fi
T=$OUT/tests.log; : > $T
run_test() { local n=$1; shift; timeout ${TL:-200} "$@" > /tmp/$n.log 2>&1; echo "$n rc=$? $(el)s" | tee -a $T; grep -E '^\[  PASSED|^\[  FAILED|ERROR SUMMARY' /tmp/$n.log | tee -a $T; grep -B3 -A14 "Failure" /tmp/$n.log | head -40 | tee -a $T; }
run_test backward_sampled build-gpu/tests/test_backward_sampled_gpu
for t in build-gpu/tests/test_*_gpu; do n=$(basename $t); [ $n = test_backward_sampled_gpu ] && continue; run_test $n $t; done
timeout 120 build-gpu/mok bench --direction backward --iterations 20 > $OUT/bench_backward.txt 2>&1; echo "bench backward rc=$? $(el)s"
grep "^| [dmqf]" $OUT/bench_backward.txt | cut -d'|' -f2-7,12,16
[ $(el) -lt 480 ] && { timeout 110 python3 bench/torch_moe_forward.py --direction backward --iterations 10 > $OUT/torch_backward.txt 2>&1; echo "torch backward rc=$? $(el)s"; tail -7 $OUT/torch_backward.txt; }
