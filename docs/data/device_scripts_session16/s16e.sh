#!/usr/bin/env bash
# Session 16, call 5 (two H200s): README tables from the final code: EP = 1 eager two rounds (GPU 0)
# beside one --graph round (GPU 1), EP = 2 two rounds, then the PyTorch pipelines (EP = 1, EP = 2).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -30 /tmp/gpu_build.log; exit 1; }
echo "build $(el)s"
H=build-gpu/mok
( for r in 1 2; do echo "### eager round $r" >> $OUT/bench_ep1.log
  CUDA_VISIBLE_DEVICES=0 timeout 60 $H bench --preset all --iterations 20 >> $OUT/bench_ep1.log 2>&1; echo "ep1 $r rc=$? $(el)s"; done ) &
( echo "### graph" >> $OUT/bench_ep1_graph.log
  CUDA_VISIBLE_DEVICES=1 timeout 60 $H bench --preset all --iterations 20 --graph 1 >> $OUT/bench_ep1_graph.log 2>&1; echo "graph rc=$? $(el)s" ) &
wait
for r in 1 2; do echo "### round $r" >> $OUT/bench_ep2.log
  timeout 40 $H bench --ep 2 --preset all --iterations 20 >> $OUT/bench_ep2.log 2>&1; echo "ep2 $r rc=$? $(el)s"; done
CUDA_VISIBLE_DEVICES=0 timeout 110 python3 bench/torch_moe_forward.py > $OUT/torch_ep1.log 2>&1; echo "torch ep1 rc=$? $(el)s"
timeout 150 torchrun --nproc-per-node 2 bench/torch_ep_forward.py --iterations 20 > $OUT/torch_ep2.log 2>&1; echo "torch ep2 rc=$? $(el)s"
awk '/^### /{h=$0; n=0} /^\| (dsv3|mok-default|qwen3-30b|fine) \|/{n++; if (n<=5) {m=split($0,a,"|"); print h, a[2], a[3], a[5], a[6], a[9]}}' $OUT/bench_ep1.log $OUT/bench_ep1_graph.log
awk '/^### /{h=$0; n=0} /^\| (dsv3|mok-default|qwen3-30b|fine) \|/{n++; if (n<=5) {m=split($0,a,"|"); print h, a[2], a[3], a[4], a[6], a[m-1]}}' $OUT/bench_ep2.log
grep -E "^\| " $OUT/torch_ep1.log | tail -6; grep -E "^\| " $OUT/torch_ep2.log | tail -6
