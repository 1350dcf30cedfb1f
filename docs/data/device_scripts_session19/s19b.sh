#!/usr/bin/env bash
# Session 19, call 2 (one H200): the bench's new sustained table (`mok bench --sustain 4`), the
# PyTorch script's sustained TFLOP/s, and which dense GEMM sustains the most under the power cap
# (three shapes through torch.matmul, 4 s each), all under an nvidia-smi trace.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -30 /tmp/gpu_build.log; exit 1; }
echo "build $(el)s"
timeout 60 build-gpu/mok run --preset tiny > /tmp/run.log 2>&1; echo "mok run rc=$? $(el)s"; tail -2 /tmp/run.log
nvidia-smi --query-gpu=timestamp,power.draw,clocks.sm,temperature.gpu,clocks_event_reasons.active \
  --format=csv,noheader,nounits -lms 100 > $OUT/trace.csv &
SMI=$!
timeout 200 build-gpu/mok bench --preset all --iterations 20 --graph 1 --sustain 4 > $OUT/bench_sustain.log 2>&1; echo "mok bench rc=$? $(el)s"
timeout 100 python3 bench/torch_moe_forward.py --shape dsv3-8k --iterations 20 --sustain 4 > $OUT/torch_sustain.log 2>&1; echo "torch rc=$? $(el)s"
cat > /tmp/dense_sweep.py <<'PY'
import time, torch
g = torch.Generator(device="cuda").manual_seed(0)
for m, n, k in ((8192, 8192, 8192), (16384, 16384, 16384), (8192, 4096, 7168), (8192, 7168, 2048)):
    a = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    b = torch.randn(k, n, device="cuda", generator=g).to(torch.bfloat16)
    for _ in range(3): a @ b
    torch.cuda.synchronize(); start = time.time(); runs = 0
    while time.time() - start < 4:
        for _ in range(8): a @ b
        runs += 8; torch.cuda.synchronize()
    end = time.time(); ms = (end - start) * 1e3 / runs
    print(f"sustained torch dense {m}x{n}x{k}: {start:.3f} to {end:.3f} s since the epoch, {runs} runs, {ms:.3f} ms each, {2*m*n*k/ms*1e-9:.0f} TFLOP/s", flush=True)
    del a, b
PY
timeout 60 python3 /tmp/dense_sweep.py > $OUT/dense_sweep.log 2>&1; echo "dense sweep rc=$? $(el)s"
kill $SMI
cat $OUT/bench_sustain.log $OUT/torch_sustain.log $OUT/dense_sweep.log > /tmp/all.log
python3 scripts/power_trace.py $OUT/trace.csv /tmp/all.log > $OUT/power.md
sed -n '/^| shape/,/^$/p' $OUT/bench_sustain.log | head -8
sed -n '/^Sustained/,/^$/p' $OUT/bench_sustain.log
grep -E "TFLOP/s" $OUT/torch_sustain.log $OUT/dense_sweep.log
cat $OUT/power.md
