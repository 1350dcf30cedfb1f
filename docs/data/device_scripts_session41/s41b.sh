#!/usr/bin/env bash
# Session 41, one GPU, after s40a: (1) where the fp8_block backward's time goes (`--breakdown 1`:
# without its weight-gradient tiles, and the waits of one profiled run, beside BF16; never run
# before); (2) the dispatch CTAs of fp8_block and mxfp8 measured again now that x comes quantized
# from its source rank (forward_plan's automatic count is twice BF16's, chosen when dispatch
# quantized): `--dispatch-ctas N` at BF16's count and twice it, each run timing BF16 beside it
# (10 iterations, 3 alternating rounds; burst rates).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
limit=${LIMIT:-300}
log=$OUT/log.txt
source scripts/device_steps.sh
bash scripts/gpu_build.sh > $OUT/build.txt 2>&1 || { tail -20 $OUT/build.txt; exit 1; }
echo "build $(el)s"
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader
b() {  # label, then mok bench's arguments
  [ $(el) -gt $(( limit - 40 )) ] && return
  echo "--- $1 $(el)s" >> $log; shift
  timeout $(( limit - 10 - $(el) )) build-gpu/mok bench --iterations 10 "$@" >> $log 2>&1
}
b "fp8_block backward breakdown qwen3" --precision fp8_block --direction backward --breakdown 1 \
  --preset qwen3-30b --tokens 8192
b "fp8_block backward breakdown dsv3 4k" --precision fp8_block --direction backward \
  --breakdown 1 --preset dsv3 --tokens 4096
for p in fp8_block mxfp8; do
  b "$p qwen3 ctas 16" --precision $p --preset qwen3-30b --tokens 8192 --dispatch-ctas 16
  b "$p qwen3 ctas 32" --precision $p --preset qwen3-30b --tokens 8192 --dispatch-ctas 32
  b "$p dsv3 8k ctas 8" --precision $p --preset dsv3 --tokens 8192 --dispatch-ctas 8
  b "$p dsv3 8k ctas 16" --precision $p --preset dsv3 --tokens 8192 --dispatch-ctas 16
done
grep -E "^\| [a-z]|^---" $log | cut -c1-230
echo "end $(el)s"
