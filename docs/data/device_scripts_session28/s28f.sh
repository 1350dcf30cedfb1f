#!/usr/bin/env bash
# Session 28, call 6 (one H200, the last device seconds): the first two shapes of
# `mok bench --sweep` (seed 1), with the sampled-row reference column.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
nccl_root="$(bash scripts/nccl_root.sh)"
cmake -S . -B build-gpu ${nccl_root:+-DMOK_NCCL_ROOT="$nccl_root"} -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOK_WERROR=ON \
  -DCMAKE_CXX_COMPILER=/usr/bin/g++ -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ -DMOK_TESTS=OFF >/tmp/cfg.log 2>&1 || { tail -20 /tmp/cfg.log; exit 1; }
cmake --build build-gpu -j 16 --target mok >/tmp/b.log 2>&1 || { grep -E "error|FAILED" -A3 /tmp/b.log | head -30; exit 1; }
build-gpu/mok bench --sweep 2 --seed 1 --iterations 3 --json $OUT/sweep.json 2>&1 | tail -6
