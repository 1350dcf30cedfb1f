#!/usr/bin/env bash
# Session 21, call 7 (one H200): mok run with the GPU backward checked against the reference
# (tiny; the qwen3-30b line was refused: the CPU reference holds FP64 parameters, 9.7 GB).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
bash scripts/gpu_build.sh > /tmp/gpu_build.log 2>&1 || { tail -40 /tmp/gpu_build.log; exit 1; }
timeout 60 build-gpu/mok run --preset tiny > $OUT/mok_run_tiny.txt 2>&1; echo "run tiny rc=$?"
tail -22 $OUT/mok_run_tiny.txt
timeout 200 build-gpu/mok run --preset qwen3-30b --tokens 256 --ep 1 > $OUT/mok_run_qwen3_256.txt 2>&1; echo "run qwen3 rc=$?"
tail -16 $OUT/mok_run_qwen3_256.txt
