#!/usr/bin/env bash
# Session 19, call 3 (one H200): the final tools: `mok run`, and `mok bench --sustain 4` with the
# sustained table's roofline columns, PyTorch's pipeline (timed and sustained) beside it, under
# an nvidia-smi trace.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -30 /tmp/gpu_build.log; exit 1; }
echo "build $(el)s"
timeout 60 build-gpu/mok run --preset tiny > /tmp/run.log 2>&1; echo "mok run rc=$? $(el)s"; tail -1 /tmp/run.log
nvidia-smi --query-gpu=timestamp,power.draw,clocks.sm,temperature.gpu,clocks_event_reasons.active \
  --format=csv,noheader,nounits -lms 100 > $OUT/trace.csv &
SMI=$!
timeout 200 build-gpu/mok bench --preset all --iterations 20 --graph 1 --sustain 4 > $OUT/bench_sustain.log 2>&1; echo "mok bench rc=$? $(el)s"
timeout 200 python3 bench/torch_moe_forward.py --iterations 20 --sustain 4 > $OUT/torch_sustain.log 2>&1; echo "torch rc=$? $(el)s"
kill $SMI
cat $OUT/bench_sustain.log $OUT/torch_sustain.log > /tmp/all.log
python3 scripts/power_trace.py $OUT/trace.csv /tmp/all.log > $OUT/power.md
sed -n '/^| shape/,/^$/p' $OUT/bench_sustain.log | grep -v "^sustained" | head -8
sed -n '/^Sustained/,/^$/p' $OUT/bench_sustain.log
grep -E "TFLOP/s|^\| " $OUT/torch_sustain.log
cat $OUT/power.md
