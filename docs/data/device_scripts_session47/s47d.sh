#!/usr/bin/env bash
# Session 47, the second call (after five refused starts): this session's code
# on the GPU, tests first, then the d_out lever's A/B. Here first: bash scripts/device_ab_base.sh
# make 989fe48 base (the commit before the lever); one GPU, carry [".device"], LIMIT=500.
#   (1) the emulated groups' timelines (new group instantiations of the trace kernels); host
#       pointers refused by name (cudaPointerGetAttributes in require_operand, relaxed around
#       captures: the backward suite's graph-replay test runs through it);
#   (2) d_out quantized once on its source rank in the fp8_block and mxfp8 backwards: their
#       suites and the emulated groups' (every precision);
#   (3) the CLI contract's GPU branch (mok trace --ep, the clocks in --json);
#   (4) the lever against base: `mok bench --precision P --direction backward --iterations 10`
#       (mok's BF16 backward beside it), alternating, then a wait profile each;
#   (5) what time is left: the Python GPU tests.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
limit=${LIMIT:-500}
log=$OUT/s47d.log
source scripts/device_steps.sh
nvidia-smi --query-gpu=name,power.limit,memory.total --format=csv,noheader
(bash scripts/device_ab_base.sh build base > $OUT/base_build.txt 2>&1) &
bash scripts/gpu_build.sh > $OUT/build.log 2>&1 || { grep -E "error|FAILED" -A3 $OUT/build.log | head -30; exit 1; }
wait
echo "builds $(el)s"
declare -A BIN=([head]=build-gpu/mok [base]=$(tail -1 $OUT/base_build.txt))
T=build-gpu/tests
run fp8_block_backward 90 $T/test_fp8_block_backward_gpu
run mxfp8_backward 90 $T/test_mxfp8_backward_gpu
[ -x "${BIN[base]}" ] || { echo "no base: $(tail -3 $OUT/base_build.txt)"; }
for round in 1 2; do
  for shape in "qwen3-30b 8192" "fine 4096"; do
    for v in head base; do bench_backward $v fp8_block $shape; done
  done
done
run emulated_timeline 90 $T/test_emulated_ep_gpu --gtest_filter='*Timeline*'
run forward 60 $T/test_forward_gpu
run emulated_ep_backward 120 $T/test_emulated_ep_backward_gpu
run moe_backward 120 $T/test_moe_backward_gpu
run cli_contract 120 bash tests/cli/check_cli.sh build-gpu/mok
tail -2 /tmp/run.txt
for v in head base; do bench_backward $v mxfp8 qwen3-30b 8192; done
for v in head base; do bench_backward $v fp8_block qwen3-30b 8192 --breakdown 1; done
for v in head base; do bench_backward $v fp8_block dsv3 4096; done
r=$PWD
if [ $(el) -lt $(( limit - 120 )) ]; then
  bash scripts/gpu_build_python.sh > $OUT/py_build.log 2>&1 || { head -30 $OUT/py_build.log; exit 1; }
  (cd /tmp && PYTHONPATH=$r/build-py/python:$r/.device/pylib timeout $(( limit - 15 - $(el) )) \
    python3 -m pytest -q -W ignore::RuntimeWarning -p no:cacheprovider --tb=short \
    $r/tests/python/test_torch_moe.py $r/tests/python/test_gpu_layer.py 2>&1 | tail -6)
fi
echo "end $(el)s"
