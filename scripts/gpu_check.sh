#!/usr/bin/env bash
# On the GPU machine: build with the system compiler (device-notes.md), run the GPU tests, the
# sanitizers on them, and the CLI. GoogleTest sources travel in .device/googletest.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
out="${OUT:-/tmp/mok-out}"
mkdir -p "$out"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOK_WERROR=ON \
  -DCMAKE_CXX_COMPILER=/usr/bin/g++ -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ \
  -DMOK_GTEST_SOURCE="$PWD/.device/googletest" >"$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
cmake --build build-gpu -j 16 >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
status=0
step() { echo "== $*"; "$@" 2>&1 | tee -a "$out/steps.log" | tail -8; local rc=${PIPESTATUS[0]}; echo "-> rc=$rc"; [ "$rc" -eq 0 ] || status=1; }
step ./build-gpu/mok info
for t in build-gpu/tests/test_*_gpu; do
  step "$t"
done
# Under the sanitizers: everything but the full-size standard shapes (the typed forward tests
# keep one standard shape, qwen3-30b at T = 2048). Waits get a longer bound: kernels run ~100x slower.
for t in build-gpu/tests/test_*_gpu; do
  MOK_WAIT_SECONDS=120 step compute-sanitizer --tool memcheck --error-exitcode 1 "$t" --gtest_filter=-DesignShapes/*
  MOK_WAIT_SECONDS=120 step compute-sanitizer --tool racecheck --error-exitcode 1 "$t" --gtest_filter=-DesignShapes/*
done
echo "== SASS: wgmma instructions (HGMMA) in the primitives test"
cuobjdump --dump-sass build-gpu/tests/test_primitives_gpu | grep -c HGMMA
step ./build-gpu/mok run --preset tiny
cuobjdump --list-elf build-gpu/libmok_cuda.a 2>&1 | head -5
if [ "${MOK_BENCH:-0}" = 1 ]; then
  echo "== grouped GEMM vs one cuBLAS GEMM of the same FLOPs (rows per expert = T*K/E)"
  nvidia-smi --query-gpu=power.draw,clocks.sm,temperature.gpu --format=csv,noheader
  ./build-gpu/grouped_gemm_bench 256 256 4096 7168 swiglu || status=1  # dsv3 T=8192, gate|up
  ./build-gpu/grouped_gemm_bench 256 256 7168 2048 || status=1         # dsv3 T=8192, down
  ./build-gpu/grouped_gemm_bench 256 128 4096 7168 swiglu || status=1  # dsv3 T=4096, gate|up
  ./build-gpu/grouped_gemm_bench 128 512 1536 2048 swiglu || status=1  # qwen3-30b, gate|up
  ./build-gpu/grouped_gemm_bench 128 512 2048 768 || status=1          # qwen3-30b, down
  nvidia-smi --query-gpu=power.draw,clocks.sm,temperature.gpu --format=csv,noheader
fi
exit $status
