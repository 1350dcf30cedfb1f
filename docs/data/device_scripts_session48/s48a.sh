#!/usr/bin/env bash
# Session 48's device call, written for a GPU that was not lent (loans paused): not run. Here
# first: git cherry-pick 22598fb (the grouped GEMM in pairs of CTAs, with its test and bench
# argument; reverted in 641a716), then at that tree
#   bash scripts/device_ab_base.sh make ce6c1b0 bwd2p    # the fp8_block backward with two partials
#   bash scripts/device_ab_base.sh make 5c705e6 both2p   # and the forward too (setmaxnreg 56 / 224)
# one GPU, carry [".device"], LIMIT=540.
#   (1) suites at HEAD: the grouped GEMM (pairs of CTAs: the single-CTA kernel's bits), the
#       forward operands (another GPU's memory refused; skipped on one GPU), fp8_block forward
#       and backward; the CLI contract's GPU branch (71be26c's mends unrun);
#   (1b) the L2 hypothesis: grouped_gemm_bench, single CTAs against pairs sharing B tiles
#       (share_b) and A tiles (share_a), on the standard shapes' GEMMs (rows per expert even
#       multiples of 128, so every share_b pair shares); likely a call of its own with (1);
#   (2) the two-partial fp8_block mainloops (benchmarks.md, session 48) against HEAD, alternating:
#       `mok bench --precision fp8_block --iterations 10` forward (both2p) and --direction
#       backward (bwd2p), qwen3-30b 8k two rounds, dsv3 4k backward and 8k forward one; each
#       variant's `mok run --precision fp8_block` against the reference first;
#   (3) mma_ceiling_bench: the two-partial MX loop no longer serialised (f6a3389);
#   (4) s9 (704x1728x14/2, T = 4), the one sweep shape behind the staged launches: its timeline
#       and breakdown;
#   (5) what time is left: compute-sanitizer, every tool, on the fp8_block backward.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
limit=${LIMIT:-540}
log=$OUT/s48a.log
source scripts/device_steps.sh
nvidia-smi --query-gpu=name,power.limit,memory.total --format=csv,noheader
for v in bwd2p both2p; do (bash scripts/device_ab_base.sh build $v > $OUT/${v}_build.txt 2>&1) & done
bash scripts/gpu_build.sh > $OUT/build.log 2>&1 || { grep -E "error|FAILED" -A3 $OUT/build.log | head -30; exit 1; }
wait
echo "builds $(el)s"
declare -A BIN=([head]=build-gpu/mok [bwd2p]=$(tail -1 $OUT/bwd2p_build.txt)
  [both2p]=$(tail -1 $OUT/both2p_build.txt))
for v in bwd2p both2p; do [ -x "${BIN[$v]}" ] || echo "no $v: $(tail -3 $OUT/${v}_build.txt)"; done
T=build-gpu/tests
run grouped_gemm 90 $T/test_grouped_gemm_gpu
for g in "256 256 4096 7168 swiglu 256" "256 256 7168 2048 store 256" \
  "128 512 1536 2048 swiglu 256" "128 512 2048 768 store 256"; do
  for c in none share_b share_a none share_b share_a; do
    timeout 60 build-gpu/grouped_gemm_bench $g $c 2>&1 | tail -1 | cut -c1-200
  done
done
run forward_operands 60 $T/test_forward_gpu --gtest_filter='MoeForwardOperands*'
run fp8_block_forward 90 $T/test_fp8_block_gpu
run fp8_block_backward 120 $T/test_fp8_block_backward_gpu
for v in bwd2p both2p; do
  run "run_fp8_$v" 90 ${BIN[$v]} run --preset qwen3-30b --tokens 2048 --precision fp8_block
  grep -iE "max|error|differ|bitwise|pass|fail" /tmp/run.txt | tail -4
done
bench_forward() {
  [ $(el) -gt $(( limit - 40 )) ] && { echo "skip $*"; return; }
  local v=$1 preset=$2 tokens=$3 f=$OUT/bench_$1.txt
  echo "--- $v forward fp8_block $preset $tokens" >> $f
  timeout $(( limit - $(el) )) ${BIN[$v]} bench --precision fp8_block --preset $preset \
    --tokens $tokens --iterations 10 > /tmp/b.txt 2>&1
  cat /tmp/b.txt >> $f
  printf '%-6s fwd fp8  ' $v
  grep -E '^\| [a-z0-9-]+ \| [0-9]' /tmp/b.txt | cut -c1-160
}
for round in 1 2; do
  for v in head both2p; do bench_forward $v qwen3-30b 8192; done
  for v in head bwd2p; do bench_backward $v fp8_block qwen3-30b 8192; done
done
for v in head both2p; do bench_forward $v dsv3 8192; done
for v in head bwd2p; do bench_backward $v fp8_block dsv3 4096; done
run mma_ceiling 60 build-gpu/mma_ceiling_bench 2000
tail -12 /tmp/run.txt
run cli_contract 120 bash tests/cli/check_cli.sh build-gpu/mok
tail -2 /tmp/run.txt
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
