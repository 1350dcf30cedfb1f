#!/usr/bin/env bash
# Session 17, call 2 (one H200), 07c888f's device code (d5ff718): what limits qwen3-30b, fine and
# dsv3 8k (ncu, one warm launch each: -s 2), and dsv3 8k sustained beside the dense cuBLAS GEMM
# (power trace) and PyTorch's pipeline in the same call.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -30 /tmp/gpu_build.log; exit 1; }
echo "build $(el)s"
M=lts__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__m_xbar2l1tex_read_bytes.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,l1tex__throughput.avg.pct_of_peak_sustained_elapsed
for s in "qwen3-30b 8192" "fine 4096" "dsv3 8192"; do
  set -- $s
  timeout 150 ncu --clock-control none -k regex:moe_forward_kernel -s 2 -c 1 --metrics $M build-gpu/mok bench --preset $1 --tokens $2 --iterations 1 > $OUT/ncu_$1_$2.txt 2>&1
  echo "ncu $1 $2 rc=$? $(el)s"
done
nvidia-smi --query-gpu=timestamp,power.draw,clocks.sm,temperature.gpu,clocks_event_reasons.active --format=csv,noheader,nounits -lms 100 > $OUT/trace.csv &
tr=$!
timeout 120 build-gpu/mok bench --preset dsv3 --tokens 8192 --iterations 20 --sustain 4 > $OUT/sustain.log 2>&1; echo "sustain rc=$? $(el)s"
kill $tr
timeout 120 python3 bench/torch_moe_forward.py --shape dsv3-8k > $OUT/torch.log 2>&1; echo "torch rc=$? $(el)s"
python3 scripts/power_trace.py $OUT/trace.csv $OUT/sustain.log
grep -E "^\| dsv3" $OUT/sustain.log | head -2; cat $OUT/torch.log | tail -2
for f in $OUT/ncu_*.txt; do echo "== $f"; grep -E "lts__|dram__|l1tex__|sm__|gpu__" $f; done
