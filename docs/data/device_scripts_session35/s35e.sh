#!/usr/bin/env bash
# Written in session 35 for the next call (unrun; carry [".device"] after
#   mkdir -p .device && cp -r /usr/src/googletest .device/googletest):
# what session 35 landed without a run: d093265's review refactor (the widening's batches, the
# quantizers' shared pair helper, gpu::LowPrecisionExperts: the nvfp4, mxfp8 and quantizer
# suites whole), mok.torch's is_first_microbatch (its GPU test) and the
# memcheck / racecheck of the low-precision paths (gpu_sanitize.sh's fp8_block and nvfp4
# backwards, nvfp4 and mxfp8 forwards), then the nvfp4 backward's benchmark on the shapes that fit
# (dsv3 4k, fine) beside BF16's.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
r=$PWD
t0=$(date +%s)
limit=${LIMIT:-580}
log=$OUT/s35e.log
source scripts/device_steps.sh
nccl_root="$(bash scripts/nccl_root.sh)"
cmake -S . -B build-gpu ${nccl_root:+-DMOK_NCCL_ROOT="$nccl_root"} -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMOK_WERROR=ON -DCMAKE_CXX_COMPILER=/usr/bin/g++ -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ \
  -DMOK_GTEST_SOURCE="$PWD/.device/googletest" > $OUT/configure.log 2>&1 || { tail -20 $OUT/configure.log; exit 1; }
cmake --build build-gpu -j 16 --target test_nvfp4_backward_gpu test_fp8_block_backward_gpu \
  test_nvfp4_gpu test_mxfp8_gpu test_formats_gpu mok > $OUT/build.log 2>&1 ||
  { grep -E "error|FAILED" -A3 $OUT/build.log | head -30; exit 1; }
echo "build $(el)s"
T=build-gpu/tests
run nvfp4_backward 150 $T/test_nvfp4_backward_gpu
run nvfp4 100 $T/test_nvfp4_gpu
run mxfp8 100 $T/test_mxfp8_gpu
run formats 60 $T/test_formats_gpu
bash scripts/gpu_build_python.sh > $OUT/py_build.log 2>&1 || { head -30 $OUT/py_build.log; exit 1; }
echo "python build $(el)s"
(cd /tmp && PYTHONPATH=$r/build-py/python timeout 200 python3 -m pytest -q -W ignore::RuntimeWarning \
  -p no:cacheprovider --tb=short -k "low_precision or micro_batches or mxfp8" \
  $r/tests/python/test_torch_moe.py 2>&1 | tail -8)
echo "python tests $(el)s"
for t in "nvfp4_backward|$T/test_nvfp4_backward_gpu|*MatchesTheQuantizedReference" \
         "fp8_block_backward|$T/test_fp8_block_backward_gpu|*MatchesTheQuantizedReference" \
         "nvfp4_forward|$T/test_nvfp4_gpu|*ForwardMatchesTheQuantizedReference" \
         "mxfp8_forward|$T/test_mxfp8_gpu|*ForwardMatchesTheQuantizedReference"; do
  IFS='|' read -r name binary filter <<<"$t"
  for tool in memcheck racecheck; do
    [ $(el) -gt $(( limit - 120 )) ] && { echo "skip $tool $name"; continue; }
    MOK_WAIT_SECONDS=300 timeout 100 compute-sanitizer --tool $tool --error-exitcode 1 $binary \
      --gtest_filter="$filter" > /tmp/san.txt 2>&1
    echo "$tool $name rc=$? $(grep -oE 'ERROR SUMMARY: [0-9]+ errors?|RACECHECK SUMMARY: [0-9]+ hazards?' /tmp/san.txt | tail -1)"
  done
done
for preset in fine dsv3; do
  [ $(el) -gt $(( limit - 60 )) ] && break
  timeout $(( limit - $(el) )) build-gpu/mok bench --precision nvfp4 --direction backward \
    --preset $preset --iterations 10 2>&1 | grep '^|' | grep -vE '^\|---'
done
echo "end $(el)s"
