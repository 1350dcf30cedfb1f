#!/usr/bin/env bash
# scripts/nvcc_guard.sh refuses what it must: wgmma_in_flight.cu compiles through it, with its
# ptxas report kept (registers and spills); with an accumulator touched in flight the compile
# fails, names the kernel and leaves no object. Usage: check_nvcc_guard.sh NVCC
set -uo pipefail
nvcc="${1:?usage: check_nvcc_guard.sh NVCC}"
here="$(cd "$(dirname "$0")" && pwd)"
guard="$here/../../scripts/nvcc_guard.sh"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
flags=(-gencode=arch=compute_90a,code=sm_90a -c "$here/wgmma_in_flight.cu")
bash "$guard" "$nvcc" "${flags[@]}" -o "$dir/good.o" 2>"$dir/good.err" ||
  fail "the pipelined loop was refused: $(cat "$dir/good.err")"
[ -s "$dir/good.o" ] || fail "no object for the pipelined loop"
grep -q "Used [0-9]* registers" "$dir/good.o.ptxas" || fail "no ptxas report beside the object"
[ -s "$dir/good.err" ] && fail "the report leaked to stderr: $(head -3 "$dir/good.err")"
bash "$guard" "$nvcc" -DTOUCH_IN_FLIGHT "${flags[@]}" -o "$dir/bad.o" 2>"$dir/bad.err" &&
  fail "an accumulator touched in flight compiled without an error"
grep -q "serialized" "$dir/bad.err" || fail "the error does not say the wgmma were serialised"
grep -q "wgmma_loop" "$dir/bad.err" || fail "the error does not name the kernel"
[ -e "$dir/bad.o" ] && fail "the refused compile left its object"
echo "nvcc_guard: the pipelined loop passes, the serialised one is refused"
