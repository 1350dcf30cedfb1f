#!/usr/bin/env bash
# Session 24, call 2 (one H200): mok bench --direction backward (keeping and recomputing g | u)
# and PyTorch's autograd backward in the same call.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -40 /tmp/gpu_build.log; exit 1; }
echo "build $(el)s"
timeout 330 build-gpu/mok bench --direction backward --iterations 20 > $OUT/bench_backward.txt 2>&1; echo "bench rc=$? $(el)s"
timeout 150 python3 bench/torch_moe_forward.py --direction backward --iterations 10 > $OUT/torch_backward.txt 2>&1; echo "torch backward rc=$? $(el)s"
echo "== bench"; grep "^| [dmqf]" $OUT/bench_backward.txt | head -5 | cut -d"|" -f2,3,5,6,10,14,15
grep -A8 "^Recomputing" $OUT/bench_backward.txt
tail -8 $OUT/torch_backward.txt
