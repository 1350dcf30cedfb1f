#!/usr/bin/env bash
# Session 48, call A: the fp8_block mainloop with two partials (1461b98) against its parent
# (37ee558), and the session's other code on the GPU. Here first: bash scripts/device_ab_base.sh
# make 37ee558 base; one GPU, carry [".device"], LIMIT=540.
#   (1) suites: fp8_block forward and backward (the mainloop's bits), the forward operands
#       (another GPU's memory refused: skipped on one GPU), the CLI contract's GPU branch (71be26c);
#   (2) A/B, alternating: `mok bench --precision fp8_block --iterations 10` forward (BF16 beside)
#       and `--direction backward`, qwen3-30b 8k two rounds, dsv3 4k backward one;
#   (3) s9's timeline and breakdown;
#   (4) what time is left: compute-sanitizer, every tool, on the fp8_block backward.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
limit=${LIMIT:-540}
log=$OUT/s48a.log
source scripts/device_steps.sh
nvidia-smi --query-gpu=name,power.limit,memory.total --format=csv,noheader
(bash scripts/device_ab_base.sh build base > $OUT/base_build.txt 2>&1) &
bash scripts/gpu_build.sh > $OUT/build.log 2>&1 || { grep -E "error|FAILED" -A3 $OUT/build.log | head -30; exit 1; }
wait
echo "builds $(el)s"
declare -A BIN=([head]=build-gpu/mok [base]=$(tail -1 $OUT/base_build.txt))
[ -x "${BIN[base]}" ] || { echo "no base: $(tail -3 $OUT/base_build.txt)"; }
T=build-gpu/tests
run fp8_block_forward 90 $T/test_fp8_block_gpu
run fp8_block_backward 120 $T/test_fp8_block_backward_gpu
run forward_operands 60 $T/test_forward_gpu --gtest_filter='MoeForwardOperands*'
bench_forward() {
  [ $(el) -gt $(( limit - 40 )) ] && { echo "skip $*"; return; }
  local v=$1 preset=$2 tokens=$3 f=$OUT/bench_$1.txt
  echo "--- $v forward fp8_block $preset $tokens" >> $f
  timeout $(( limit - $(el) )) ${BIN[$v]} bench --precision fp8_block --preset $preset \
    --tokens $tokens --iterations 10 > /tmp/b.txt 2>&1
  cat /tmp/b.txt >> $f
  printf '%-5s fwd fp8  ' $v
  grep -E '^\| [a-z0-9-]+ \| [0-9]' /tmp/b.txt | cut -c1-160
}
for round in 1 2; do
  for v in head base; do bench_forward $v qwen3-30b 8192; bench_backward $v fp8_block qwen3-30b 8192; done
done
for v in head base; do bench_forward $v dsv3 8192; bench_backward $v fp8_block dsv3 4096; done
run cli_contract 120 bash tests/cli/check_cli.sh build-gpu/mok
tail -2 /tmp/run.txt
# s9 (704x1728x14/2, T = 4), the one sweep shape behind the staged launches: its timeline and
# breakdown (where the megakernel's 0.06 ms beside the schedule go).
run s9_trace 60 build-gpu/mok trace --hidden 704 --intermediate 1728 --experts 14 --top-k 2 \
  --tokens 4 --out $OUT/s9_trace.json
grep -vE "^\s*$" /tmp/run.txt | tail -22
run s9_breakdown 60 build-gpu/mok bench --sweep 40 --seed 1 --shapes 9-9 --breakdown 1 --iterations 10
grep -E "^\|" /tmp/run.txt | tail -6 | cut -c1-240
left=$(( limit - $(el) - 10 ))
if [ $left -gt 60 ]; then
  ONLY="fp8_block backward" LIMIT=$(( left / 4 )) timeout $left bash scripts/gpu_sanitize.sh 2>&1 | tail -8
fi
echo "end $(el)s"
