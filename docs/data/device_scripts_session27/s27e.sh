#!/usr/bin/env bash
# Session 27, call 5 (one H200): where the fp8_block forward's time goes: `mok bench --precision
# fp8_block --breakdown 1` (wait profiles beside BF16's) on qwen3-30b 8k and dsv3 8k, and ncu's
# warp-state and tensor-pipe figures of the fp8_block megakernel on qwen3-30b 8k.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh || exit 1
echo "build $(el)s"
for sh in "qwen3-30b 8192" "dsv3 8192"; do set -- $sh
  timeout 120 build-gpu/mok bench --precision fp8_block --preset $1 --tokens $2 --iterations 10 --breakdown 1 2>&1 | grep "^|" | grep -v "^|---"
done
echo "bench $(el)s"
M=gpu__time_duration.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_elapsed,sm__cycles_elapsed.avg.per_second,lts__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active
timeout 200 ncu --clock-control none -k regex:fp8_block_kernel -s 0 -c 1 --section WarpStateStats --metrics $M build-gpu/mok bench --precision fp8_block --preset qwen3-30b --tokens 8192 --iterations 1 > $OUT/ncu_fp8_qwen3_s27e.txt 2>&1; echo "ncu rc=$? $(el)s"
grep -E "gpu__time|gmma|cycles_elapsed|lts__|dram__|wavefronts|inst_executed|warps_active|Stall|stall|Warp Cycles|Issue" $OUT/ncu_fp8_qwen3_s27e.txt | head -40
