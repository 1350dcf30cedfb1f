#!/usr/bin/env bash
# Sourced by the device scripts (docs/data/device_scripts_session*/): el (seconds since t0) and
# run NAME TIMEOUT COMMAND... (its output appended to $log under "=== NAME", one summary line with
# gtest's counts, and the failure lines when it fails; /tmp/run.txt keeps the last output).
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
