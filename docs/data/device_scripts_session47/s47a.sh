#!/usr/bin/env bash
# Session 47, call A. Here first: bash scripts/device_ab_base.sh make a225ff7 base; then one GPU,
# carry [".device"], LIMIT=560.
#   (1) the CLI contract's GPU branch on 5ea58dc's host code (mok run's sampled path with one
#       BenchGradients, mok trace, bench --json), not yet run on a GPU;
#   (2) issue 32's "presets no slower than before": the BF16 forward of the five standard shapes,
#       this tree against a225ff7 (before the 256-wide tiles over padded widths put a runtime
#       column bound in the gate/up epilogue), two alternating rounds, `mok bench --iterations 10`;
#   (3) the 40-shape sweep with the new tile rule (`--sweep 40 --seed 1 --shapes i-i`, one shape
#       per process so that a call's end cuts between shapes), from FIRST (default 0).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
limit=${LIMIT:-560}
log=$OUT/s47a.log
source scripts/device_steps.sh
nvidia-smi --query-gpu=name,power.limit,memory.total --format=csv,noheader
bash scripts/gpu_build.sh > $OUT/build.log 2>&1 || { grep -E "error|FAILED" -A3 $OUT/build.log | head -30; exit 1; }
echo "build $(el)s"
run cli_contract 150 bash tests/cli/check_cli.sh build-gpu/mok
tail -2 /tmp/run.txt
base=$(bash scripts/device_ab_base.sh build base 2>&1 | tail -1)
echo "base build $(el)s: $base"
for round in 1 2; do
  for v in base head; do
    bin=build-gpu/mok; [ $v = base ] && bin=$base
    [ $(el) -gt $(( limit - 120 )) ] && continue
    timeout 150 $bin bench --iterations 10 > /tmp/p.txt 2>&1
    echo "--- round $round $v" >> $OUT/presets.txt; cat /tmp/p.txt >> $OUT/presets.txt
    grep -E "^\| (dsv3|mok-default|qwen3-30b|fine) \| [0-9]" /tmp/p.txt | cut -c1-70 | sed "s/^/$round $v /"
  done
done
echo "presets done $(el)s"
for i in $(seq ${FIRST:-0} 39); do
  [ $(el) -gt $(( limit - 40 )) ] && { echo "sweep stopped before s$i at $(el)s"; break; }
  timeout $(( limit - 10 - $(el) )) build-gpu/mok bench --sweep 40 --seed 1 --shapes $i-$i \
    --iterations 10 > /tmp/s.txt 2>&1
  echo "--- s$i rc=$?" >> $OUT/sweep.txt; cat /tmp/s.txt >> $OUT/sweep.txt
  grep -E "^\| s[0-9]+ " /tmp/s.txt | cut -c1-220
  grep -E "out of memory|FAIL|error" /tmp/s.txt | head -2
done
echo "end $(el)s"
