#!/usr/bin/env bash
# Session 47, call B: this session's code on the GPU, tests first. One GPU, carry [".device"],
# LIMIT=560. In order of what is least checked:
#   (1) the emulated groups' timelines (forward and backward: new group instantiations of the
#       trace kernels); host pointers refused by name (cudaPointerGetAttributes in
#       require_operand, relaxed around captures: the backward suite's graph-replay test, the
#       PyTorch layer's CUDA-graph tests run through it);
#   (2) d_out quantized on its source rank in the fp8_block and mxfp8 backwards: their suites,
#       the emulated groups' (every precision);
#   (3) the CLI contract's GPU branch: mok trace --ep 4 / --ep 2 --direction backward, the clocks
#       in bench and run --json (NVML);
#   (4) the Python GPU tests (the PyTorch layer's graphs through the new operand check).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
limit=${LIMIT:-560}
log=$OUT/s47b.log
source scripts/device_steps.sh
nvidia-smi --query-gpu=name,power.limit,memory.total --format=csv,noheader
bash scripts/gpu_build.sh > $OUT/build.log 2>&1 || { grep -E "error|FAILED" -A3 $OUT/build.log | head -30; exit 1; }
echo "build $(el)s"
T=build-gpu/tests
run emulated_timeline 120 $T/test_emulated_ep_gpu --gtest_filter='*Timeline*'
run forward 120 $T/test_forward_gpu
run fp8_block_backward 120 $T/test_fp8_block_backward_gpu
run mxfp8_backward 120 $T/test_mxfp8_backward_gpu
run emulated_ep_backward 150 $T/test_emulated_ep_backward_gpu
run moe_backward 150 $T/test_moe_backward_gpu
run cli_contract 150 bash tests/cli/check_cli.sh build-gpu/mok
tail -2 /tmp/run.txt
timeout 60 build-gpu/mok bench --preset qwen3-30b --iterations 10 --json $OUT/bench_qwen3.json > /dev/null 2>&1
python3 -c "import json; print('clocks', json.load(open('$OUT/bench_qwen3.json'))['clocks'])"
r=$PWD
if [ $(el) -lt $(( limit - 150 )) ]; then
  bash scripts/gpu_build_python.sh > $OUT/py_build.log 2>&1 || { head -30 $OUT/py_build.log; exit 1; }
  (cd /tmp && PYTHONPATH=$r/build-py/python:$r/.device/pylib timeout $(( limit - 20 - $(el) )) \
    python3 -m pytest -q -W ignore::RuntimeWarning -p no:cacheprovider --tb=short \
    $r/tests/python/test_torch_moe.py $r/tests/python/test_gpu_layer.py 2>&1 | tail -6)
fi
echo "end $(el)s"
