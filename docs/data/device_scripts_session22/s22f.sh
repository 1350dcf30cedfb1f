#!/usr/bin/env bash
# Session 22, call 6 (one H200): the closing check. Build HEAD and the base (98d280c: HEAD
# without the longer tile-order lag); forward digests against session 20's; every GPU suite (the
# sampled standard-shape check first); mok bench --direction backward A/B in alternating rounds
# and PyTorch's autograd backward, in the same call.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -40 /tmp/gpu_build.log; exit 1; }
echo "build $(el)s"
BASE=$(bash scripts/device_ab_base.sh build base | tail -1); echo "base $BASE $(el)s"
timeout 150 build-gpu/forward_digests > $OUT/digests_head.txt 2>&1; echo "digests rc=$? $(el)s"
if cmp -s docs/data/session20/digests_e7fbf6e.txt $OUT/digests_head.txt; then echo "DIGESTS IDENTICAL to e7fbf6e"; else echo "DIGESTS DIFFER"; fi
T=$OUT/tests.log; : > $T
run_test() { local n=$1; shift; timeout ${TL:-200} "$@" > /tmp/$n.log 2>&1; echo "$n rc=$? $(el)s" | tee -a $T; grep -E '^\[  PASSED|^\[  FAILED|ERROR SUMMARY' /tmp/$n.log | tee -a $T; grep -B3 -A14 "Failure" /tmp/$n.log | head -40 | tee -a $T; }
run_test test_backward_sampled_gpu build-gpu/tests/test_backward_sampled_gpu
for t in build-gpu/tests/test_*_gpu; do n=$(basename $t); [ $n = test_backward_sampled_gpu ] && continue; run_test $n $t; done
for r in 1 2; do
  timeout 100 $BASE bench --direction backward --iterations 20 > $OUT/bench_base_$r.txt 2>&1; echo "base bench rc=$? $(el)s"
  timeout 100 build-gpu/mok bench --direction backward --iterations 20 > $OUT/bench_head_$r.txt 2>&1; echo "head bench rc=$? $(el)s"
done
for f in $OUT/bench_base_1.txt $OUT/bench_head_1.txt $OUT/bench_base_2.txt $OUT/bench_head_2.txt; do echo "== $(basename $f)"; grep "^| [dmqf]" $f | head -5 | cut -d'|' -f2,3,5,8,9,10,13,16; done
[ $(el) -lt 470 ] && { timeout 110 python3 bench/torch_moe_forward.py --direction backward --iterations 10 > $OUT/torch_backward.txt 2>&1; echo "torch backward rc=$? $(el)s"; tail -7 $OUT/torch_backward.txt; }
