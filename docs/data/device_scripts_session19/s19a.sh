#!/usr/bin/env bash
# Session 19, call 1 (one H200): what the 700 W cap lets a dense GEMM sustain, beside mok's forward,
# the cuBLAS pipeline and the PyTorch pipeline on every standard shape, each run back to back for
# 4 s under an nvidia-smi trace (power, SM clock, throttle reasons); plus the usual timed table.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
nvidia-smi --query-gpu=name,power.limit,power.max_limit,clocks.max.sm,clocks.max.mem --format=csv | tee $OUT/gpu.txt
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -30 /tmp/gpu_build.log; exit 1; }
echo "build $(el)s"
nvidia-smi --query-gpu=timestamp,power.draw,clocks.sm,temperature.gpu,clocks_event_reasons.active \
  --format=csv,noheader,nounits -lms 100 > $OUT/trace.csv &
SMI=$!
timeout 200 build-gpu/mok bench --preset all --iterations 20 --graph 1 --sustain 4 > $OUT/bench_sustain.log 2>&1; echo "mok bench rc=$? $(el)s"
timeout 200 python3 bench/torch_moe_forward.py --iterations 20 --sustain 4 > $OUT/torch_sustain.log 2>&1; echo "torch rc=$? $(el)s"
kill $SMI
python3 scripts/power_trace.py $OUT/trace.csv $OUT/bench_sustain.log > $OUT/power_mok.md
python3 scripts/power_trace.py $OUT/trace.csv $OUT/torch_sustain.log > $OUT/power_torch.md
sed -n '/^| shape/,/^$/p' $OUT/bench_sustain.log | head -8
grep -E "^\| " $OUT/torch_sustain.log | head -8
cat $OUT/power_mok.md $OUT/power_torch.md
