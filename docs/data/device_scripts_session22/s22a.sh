#!/usr/bin/env bash
# Session 22, call 1 (one H200): where the backward's time goes. Build; mok bench --direction
# backward --breakdown 1 on the standard shapes; ncu of the BF16 backward at dsv3 4k and qwen3-30b.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -40 /tmp/gpu_build.log; exit 1; }
echo "build $(el)s"
timeout 240 build-gpu/mok bench --direction backward --breakdown 1 --iterations 10 > $OUT/bench_backward_breakdown.txt 2>&1; echo "bench rc=$? $(el)s"
M=dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum,l1tex__m_xbar2l1tex_read_bytes.sum,l1tex__m_l1tex2xbar_write_bytes.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct,sm__cycles_elapsed.avg.per_second,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum
for sh in "dsv3 4096" "qwen3-30b 8192" "fine 4096"; do set -- $sh
  [ $(el) -lt 480 ] && { timeout 150 ncu --clock-control none -k regex:moe_backward_kernel -s 0 -c 1 --metrics $M build-gpu/mok bench --direction backward --preset $1 --tokens $2 --iterations 1 > $OUT/ncu_backward_$1_$2.txt 2>&1; echo "ncu $1 rc=$? $(el)s"; }
done
sed -n '/Breakdown/,$p' $OUT/bench_backward_breakdown.txt
grep "^| [dmqf]" $OUT/bench_backward_breakdown.txt | head -5 | cut -d'|' -f2-5,13
for f in $OUT/ncu_backward_*; do echo "== $f"; grep -E "^\s+(dram|gpu__|l1tex|lts|sm__|smsp)" $f | awk '{print $1, $(NF)}'; done
