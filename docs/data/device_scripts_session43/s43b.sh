#!/usr/bin/env bash
# Session 43, one GPU (carry [".device"]): where the fp8_block backward loses to BF16. The new
# fp8_block timeline (`mok trace --direction backward --precision fp8_block`) and its tests, then
# both precisions' backward timelines on qwen3-30b 8k and fine 4k (gzipped Chrome traces back in
# $OUT, drawn here with bench/plot_trace.py), and the backward breakdown with 16 and 32 dispatch
# CTAs (is the dispatch, 1.8x BF16's copying time, on the critical path?).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
limit=${LIMIT:-540}
log=$OUT/s43b.log
source scripts/device_steps.sh
nvidia-smi --query-gpu=name,power.limit,memory.total --format=csv,noheader
nccl_root="$(bash scripts/nccl_root.sh)"
cmake -S . -B build-gpu ${nccl_root:+-DMOK_NCCL_ROOT="$nccl_root"} -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMOK_WERROR=ON -DCMAKE_CXX_COMPILER=/usr/bin/g++ -DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++ \
  -DMOK_GTEST_SOURCE="$PWD/.device/googletest" > $OUT/configure.log 2>&1 || { tail -20 $OUT/configure.log; exit 1; }
cmake --build build-gpu -j 16 --target mok test_moe_backward_gpu test_fp8_block_backward_gpu \
  > $OUT/build.log 2>&1 || { grep -E "error|FAILED" -A3 $OUT/build.log | head -30; exit 1; }
echo "build $(el)s"
T=build-gpu/tests
run fp8_block_backward 120 $T/test_fp8_block_backward_gpu
run moe_backward 150 $T/test_moe_backward_gpu
run cli_contract 120 bash tests/cli/check_cli.sh build-gpu/mok
for shape in "qwen3-30b 8192" "fine 4096"; do
  set -- $shape
  for prec in bf16 fp8_block; do
    [ $(el) -gt $(( limit - 60 )) ] && continue
    echo "--- trace $1 $2 $prec $(el)s" | tee -a $log
    timeout 60 build-gpu/mok trace --preset $1 --tokens $2 --direction backward --precision $prec \
      --out /tmp/trace.json >> $log 2>&1
    echo "rc=$?" >> $log
    gzip -c /tmp/trace.json > $OUT/trace_${1}_${prec}.json.gz
  done
done
grep -E "^mok trace|^\| (consumer|producer|dispatch|combine|store|dgrad|wgrad)|overlap" $log | cut -c1-160
for ctas in 16 32; do
  [ $(el) -gt $(( limit - 40 )) ] && continue
  echo "--- breakdown qwen3-30b 8192 dispatch $ctas $(el)s" | tee -a $log
  timeout $(( limit - 10 - $(el) )) build-gpu/mok bench --precision fp8_block --direction backward \
    --preset qwen3-30b --tokens 8192 --iterations 10 --breakdown 1 --dispatch-ctas $ctas > /tmp/b.txt 2>&1
  echo "rc=$?"; cat /tmp/b.txt >> $log
  grep -E "^\|" /tmp/b.txt | grep -vE "^\|---" | cut -c1-250
done
echo "end $(el)s"
