#!/usr/bin/env bash
# The CUDA compiler launcher (CMakeLists.txt sets it): runs the nvcc command it is given with
# ptxas's resource report on, keeps the report beside the object (OBJECT.ptxas: registers, stack
# and spills per kernel; scripts/ptxas_summary.py tabulates them) and fails the compile where
# ptxas reports on the wgmma pipeline (its C75xx infos): it serialised a kernel's wgmma, or
# injected waits or arrives, because accumulators were touched or registers ran short. Those are
# silent losses of most of the tensor rate; every mok kernel must compile without them.
set -uo pipefail
object=""
previous=""
for arg in "$@"; do
  [ "$previous" = "-o" ] && object="$arg"
  previous="$arg"
done
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
"$@" -Xptxas -v 2>"$log"
rc=$?
# ptxas -v's lines: "ptxas info ..." and the indented "N bytes stack frame, ..." after each.
report='^ptxas info|^ +[0-9]+ bytes stack frame'
[ -n "$object" ] && [ $rc -eq 0 ] && grep -E "$report" "$log" >"$object.ptxas"
grep -vE "$report" "$log" >&2
pipeline='^ptxas info +: \(C75[0-9][0-9]\)'  # its infos on a kernel's wgmma pipeline
if [ $rc -eq 0 ] && grep -qE "$pipeline" "$log"; then
  echo "error: ptxas reports on the wgmma pipeline of ${object:-this source} (serialised or" \
    "injected waits: see scripts/nvcc_guard.sh):" >&2
  grep -E "$pipeline" "$log" | sed 's/^ptxas info *: /  /' >&2
  [ -n "$object" ] && rm -f "$object"
  exit 1
fi
exit $rc
