#!/usr/bin/env bash
# Sourced by the device scripts (docs/data/device_scripts_session*/): el (seconds since t0) and
# run NAME TIMEOUT COMMAND... (its output appended to $log under "=== NAME", one summary line with
# gtest's counts, and the failure lines when it fails; /tmp/run.txt keeps the last output), and
# bench_backward VARIANT PRECISION PRESET TOKENS [ARGS...] (below).
t0=${t0:-$(date +%s)}
el() { echo $(( $(date +%s) - t0 )); }
run() {
  local name=$1 limit=$2; shift 2
  local s=$(date +%s)
  timeout "$limit" "$@" > /tmp/run.txt 2>&1; local rc=$?
  echo "=== $name" >> "$log"; cat /tmp/run.txt >> "$log"
  printf '%-30s rc=%-3s %4ss %s\n' "$name" $rc $(( $(date +%s) - s )) \
    "$(grep -hoE '\[  PASSED  \] [0-9]+ tests?|\[  FAILED  \] [0-9]+ tests?' /tmp/run.txt | tr '\n' ' ')"
  [ $rc -ne 0 ] && grep -E "Failure|Expected|Which is|differs|exception|FAIL|error" /tmp/run.txt | head -8
  return 0
}
# `mok bench --direction backward --iterations 10` of the binary ${BIN[VARIANT]} (an associative
# array the script declares), which times mok's BF16 backward beside PRECISION's: its output
# appended to $OUT/bench_VARIANT.txt, its table rows printed; skipped within 40 s of $limit.
bench_backward() {
  [ $(el) -gt $(( limit - 40 )) ] && { echo "skip $*"; return; }
  local v=$1 precision=$2 preset=$3 tokens=$4
  shift 4
  local f=$OUT/bench_$v.txt
  echo "--- $v $precision $preset $tokens $*" >> $f
  timeout $(( limit - $(el) )) ${BIN[$v]} bench --precision $precision --direction backward \
    --preset $preset --tokens $tokens --iterations 10 "$@" > /tmp/b.txt 2>&1
  cat /tmp/b.txt >> $f
  printf '%-5s %-9s ' $v $precision
  grep -E '^\| [a-z0-9-]+ \| [0-9]|^\| [a-z0-9-]+ T = |does not fit|out of memory' /tmp/b.txt | cut -c1-160
}
