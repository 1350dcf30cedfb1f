#!/usr/bin/env bash
# Session 39, one GPU (carry [".device"], with googletest and .device/pylib: pip install --target
# .device/pylib nanobind pytest): the mxfp8 backward's suite (new), the suites its changes touch
# (the mxfp8 forward and its quantizer, every backward: the tile table's entries went 32-bit),
# those session 38 did not reach (Fp8BlockBackwardGpu, MegakernelFuzzGpu) or changed
# (BackwardSampledGpu, MoeBackwardGpu), and the PyTorch layer's low-precision tests (mxfp8 now
# trains). s39b.sh: the benchmarks.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
limit=${LIMIT:-560}
log=$OUT/log.txt
source scripts/device_steps.sh
nccl_root="$(bash scripts/nccl_root.sh)"
cmake -S . -B build-gpu ${nccl_root:+-DMOK_NCCL_ROOT="$nccl_root"} -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMOK_WERROR=ON -DCMAKE_CXX_COMPILER=/usr/bin/g++ -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ \
  -DMOK_GTEST_SOURCE="$PWD/.device/googletest" > $OUT/configure.log 2>&1 || { tail -20 $OUT/configure.log; exit 1; }
cmake --build build-gpu -j 16 > $OUT/build.log 2>&1 ||
  { grep -E "error|FAILED" -A3 $OUT/build.log | head -30; exit 1; }
echo "build $(el)s"
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader
b=build-gpu/tests
run mxfp8_backward 200 $b/test_mxfp8_backward_gpu
run mxfp8 120 $b/test_mxfp8_gpu
run nvfp4_backward 120 $b/test_nvfp4_backward_gpu
run fp8_block_backward 200 $b/test_fp8_block_backward_gpu
run moe_backward 200 $b/test_moe_backward_gpu
run emulated_ep_backward 200 $b/test_emulated_ep_backward_gpu
run sampled_backward 200 $b/test_backward_sampled_gpu
[ $(el) -lt $(( limit - 150 )) ] && run fuzz 120 $b/test_megakernel_fuzz_gpu
echo "tests $(el)s"
grep -h "^\[ mxfp8 backward \]" $log | cut -c1-200
r=$PWD
bash scripts/gpu_build_python.sh > $OUT/py_build.log 2>&1 || { head -30 $OUT/py_build.log; exit 1; }
echo "python build $(el)s"
(cd /tmp && PYTHONPATH=$r/build-py/python:$r/.device/pylib timeout $(( limit - 10 - $(el) )) \
  python3 -m pytest -q -W ignore::RuntimeWarning -p no:cacheprovider --tb=short \
  -k "low_precision or micro_batches or opcheck" $r/tests/python/test_torch_moe.py 2>&1 | tail -8)
echo "end $(el)s"
