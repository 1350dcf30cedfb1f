#!/usr/bin/env bash
# Session 18, call 6 (one H200): ncu of dsv3 8k's megakernel and its three stage probes (the
# dispatch-copy instantiation, one warm launch each: -s 2), matched by mangled name.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -30 /tmp/gpu_build.log; exit 1; }
echo "build $(el)s"
M=lts__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__m_xbar2l1tex_read_bytes.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,l1tex__throughput.avg.pct_of_peak_sustained_elapsed
for s in "dsv3 8192" "qwen3-30b 8192"; do
  set -- $s
  for v in 0 1 2 3; do
    timeout 100 ncu --clock-control none --kernel-name-base mangled -k regex:"moe_forward_kernelILi256ELb0ELb1ELi${v}E" -s 2 -c 1 --metrics $M build-gpu/mok bench --preset $1 --tokens $2 --iterations 1 --stage-probes 1 > $OUT/ncu_$1_$2_probe$v.txt 2>&1
    echo "ncu $1 probe $v rc=$? $(el)s"
  done
done
for f in $OUT/ncu_*.txt; do echo "== $f"; grep -E "lts__|dram__|l1tex__|sm__|gpu__" $f; done
