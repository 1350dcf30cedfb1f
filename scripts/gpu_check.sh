#!/usr/bin/env bash
# On the GPU machine: build with the system compiler (device-notes.md), run the GPU tests, the
# sanitizers on them, and the CLI. GoogleTest sources travel in .device/googletest.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
out="${OUT:-/tmp/mok-out}"
mkdir -p "$out"
bash scripts/gpu_build.sh || exit 1
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
echo "== SASS: wgmma instructions (HGMMA) in the primitives test, and HGMMA / HMMA in the megakernel"
cuobjdump --dump-sass build-gpu/tests/test_primitives_gpu | grep -c HGMMA
mega_sass() { cuobjdump --dump-sass build-gpu/tests/test_moe_forward_gpu | awk '/Function : /{f=/moe_forward_kernel/} f'; }
echo "HGMMA $(mega_sass | grep -c HGMMA), HMMA $(mega_sass | grep -c ' HMMA')"
step ./build-gpu/mok run --preset tiny
cuobjdump --list-elf build-gpu/libmok_cuda.a 2>&1 | head -5
if [ "${MOK_BENCH:-0}" = 1 ]; then
  echo "== the layer: megakernel, cuBLAS pipeline, staged launches; then PyTorch"
  ./build-gpu/mok bench --preset all --breakdown 1 || status=1
  python3 bench/torch_moe_forward.py || status=1
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
