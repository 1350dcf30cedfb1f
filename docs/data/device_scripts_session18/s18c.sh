#!/usr/bin/env bash
# Session 18, call 3 (one H200): the stage probes with each variant's waits (every shape), and ncu
# of dsv3 8k's megakernel and its three probes (one warm launch each, -s 2).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -30 /tmp/gpu_build.log; exit 1; }
echo "build $(el)s"
timeout 120 build-gpu/mok bench --preset all --iterations 20 --graph 1 --stage-probes 1 > $OUT/bench_probes_waits.log 2>&1; echo "probes rc=$? $(el)s"
M=lts__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__m_xbar2l1tex_read_bytes.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,l1tex__throughput.avg.pct_of_peak_sustained_elapsed
for v in 0 1 2 3; do
  timeout 120 ncu --clock-control none -k regex:"moe_forward_kernelILi256ELb0ELb1ELi${v}E" -s 2 -c 1 --metrics $M build-gpu/mok bench --preset dsv3 --tokens 8192 --iterations 1 --stage-probes 1 > $OUT/ncu_dsv3_8192_probe$v.txt 2>&1
  echo "ncu probe $v rc=$? $(el)s"
done
sed -n '/^Stage probes/,$p' $OUT/bench_probes_waits.log
for f in $OUT/ncu_*.txt; do echo "== $f"; grep -E "lts__|dram__|l1tex__|sm__|gpu__" $f; done
