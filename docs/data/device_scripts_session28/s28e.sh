#!/usr/bin/env bash
# Session 28, call 5 (one H200, the session's last device minutes): `mok bench --json` on the
# GPU: the CLI contract (its GPU branch runs `mok bench --preset tiny --json` and checks the
# JSON), then one JSON per standard shape (qwen3-30b, fine, dsv3 4k as time allows) for
# bench/plot_bench.py.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
nccl_root="$(bash scripts/nccl_root.sh)"
cmake -S . -B build-gpu ${nccl_root:+-DMOK_NCCL_ROOT="$nccl_root"} -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOK_WERROR=ON \
  -DCMAKE_CXX_COMPILER=/usr/bin/g++ -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ -DMOK_TESTS=OFF >/tmp/cfg.log 2>&1 || { tail -20 /tmp/cfg.log; exit 1; }
cmake --build build-gpu -j 16 --target mok >/tmp/b.log 2>&1 || { grep -E "error|FAILED" -A3 /tmp/b.log | head -30; exit 1; }
echo "build $(el)s"
timeout 60 bash tests/cli/check_cli.sh build-gpu/mok 2>&1 | tail -3
echo "cli $(el)s"
for shape in qwen3-30b fine dsv3; do
  [ $(el) -gt 150 ] && break
  timeout 60 build-gpu/mok bench --preset $shape --iterations 10 --json $OUT/bench_$shape.json 2>&1 | grep "^| $shape"
  echo "$shape $(el)s"
done
