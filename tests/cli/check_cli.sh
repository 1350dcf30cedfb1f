#!/usr/bin/env bash
# The `mok` command line's contract (issue 31): usage errors are one line naming the value as
# given and what is allowed, before any work and without a GPU, with exit code 2; each command's
# --help lists its own options. Usage: check_cli.sh path/to/mok
set -u
mok="$1"
failures=0
expect() {  # expect CODE REGEX ARGS...: the exit code, and REGEX matching the first output line
  local code="$1" regex="$2"
  shift 2
  local out rc
  out="$("$mok" "$@" 2>&1)"
  rc=$?
  local first="${out%%$'\n'*}"
  if [ "$rc" != "$code" ] || ! [[ "$first" =~ $regex ]]; then
    echo "FAIL: mok $*: exit $rc (want $code), first line: $first (want /$regex/)"
    failures=$((failures + 1))
  fi
}
expect 0 '^mok [0-9]+\.[0-9]+\.[0-9]+ \(' --version
expect 2 "^mok run: --tokens abc: expected an integer in \[1, 1048576\]$" run --tokens abc
expect 2 "^mok run: --tokens -1: expected an integer" run --tokens -1
expect 2 "^mok bench: --tokens 99999999999: expected an integer in \[1, 1048576\]$" \
  bench --preset dsv3 --tokens 99999999999
expect 2 "^mok bench: --iterations abc: expected an integer in \[1, 100000\]$" bench --iterations abc
expect 2 "^mok bench: --iterations 1.5: expected an integer" bench --iterations 1.5
expect 2 "^mok bench: --sustain -3: expected a number in" bench --sustain -3
expect 2 "^mok bench: --fp8-scales ue8m0: fp8_block's option \(--precision fp8_block\)$" \
  bench --fp8-scales ue8m0
expect 2 "^mok run: --fp8-scales ue8m0: fp8_block's option \(--precision fp8_block\)$" \
  run --preset tiny --fp8-scales ue8m0
expect 2 "^mok run: --fp8-scales e8: expected one of fp32, ue8m0$" run --fp8-scales e8
expect 2 "^mok run: --ep 3: expected one of 1, 2, 4, 8$" run --ep 3
expect 2 "^mok run: --ep 8: expected a divisor of the 4 experts$" \
  run --hidden 256 --intermediate 128 --experts 4 --top-k 2 --ep 8
expect 2 "^mok run: --preset nope: expected one of tiny, dsv3" run --preset nope
expect 2 "^mok run: invalid config: hidden = 250 is not allowed" \
  run --hidden 250 --intermediate 128 --experts 8 --top-k 2
expect 2 "^mok run: --tokens 2000000: expected an integer in \[1, 1048576\]$" \
  run --preset tiny --tokens 2000000
expect 2 "^mok run: a layer by its numbers needs --intermediate, --experts, --top-k too" \
  run --hidden 256
expect 2 "^mok run: a layer by its numbers needs --hidden, --intermediate, --top-k too" \
  run --experts 8 --shared-experts 1
expect 2 "^mok run: --shared-width 100: the layer has no shared expert \(add --shared-experts N\)$" \
  run --hidden 256 --intermediate 128 --experts 8 --top-k 2 --shared-width 100
expect 2 "^mok run: --seed -1: expected an integer in \[0, 9223372036854775807\]$" run --seed -1
expect 2 "^mok bench: --seed -1: expected an integer in \[0, 9223372036854775807\]$" \
  bench --seed -1
expect 2 "^mok trace: --seed x: expected an integer in \[0, 9223372036854775807\]$" \
  trace --seed x
expect 2 "^mok run: unknown option '--frob' for run" run --frob 1
expect 2 "^mok run: --seed needs a value$" run --seed
expect 2 "^mok bench: --graph maybe: expected 1 or 0" bench --graph maybe
expect 2 "^mok run: --routing zipf: expected one of random, balanced, skewed$" run --routing zipf
expect 2 "^mok run: --zipf applies to --routing skewed \(the routing is random\)$" run --zipf 1.2
expect 2 "^mok bench: --zipf 9: expected a number in \[0, 8\]$" bench --routing skewed --zipf 9
expect 0 "^mok run: preset tiny, .*routing skewed \(zipf 1\.20\)$" \
  run --preset tiny --ep 1 --routing skewed --zipf 1.2
expect 2 "^mok bench: --tokens needs a layer" bench --tokens 64
expect 2 "^mok: unknown command 'frob'" frob
expect 2 "^mok: a command is needed \(info, run, bench, trace\)$"
expect 2 "^mok info: info takes no options" info --verbose
expect 0 "^usage: mok run \[options\]$" run --help
expect 0 "^usage: mok bench \[options\]$" bench --help
# Each command's help has its own options only.
if "$mok" run --help | grep -q -- "--stage-probes"; then
  echo "FAIL: mok run --help lists bench's --stage-probes"
  failures=$((failures + 1))
fi
if ! "$mok" bench --help | grep -q -- "--stage-probes"; then
  echo "FAIL: mok bench --help misses --stage-probes"
  failures=$((failures + 1))
fi
# Options one bench path reads are refused on the others, not ignored; rows are whole tiles.
expect 2 "^mok bench: --graph 1 applies to the BF16 forward at EP = 1" bench --graph 1 --ep 2
expect 2 "^mok bench: --sustain applies to the BF16 forward at EP = 1" \
  bench --sustain 5 --precision fp8_block
expect 2 "^mok bench: --graph 1 applies to the BF16 forward at EP = 1" \
  bench --graph 1 --direction backward
expect 2 "^mok bench: --stage-probes 1 applies to the BF16 forward at EP = 1" \
  bench --stage-probes 1 --precision nvfp4
expect 2 "^mok bench: --breakdown 1 times EP = 1 only" bench --breakdown 1 --ep 2
expect 2 "^mok bench: --row-path gather: the low precisions take the dispatch copy" \
  bench --row-path gather --precision mxfp8
expect 2 "^mok bench: --overlap-rows 100: expected a multiple of 128 \(0: automatic\)$" \
  bench --overlap-rows 100
expect 2 "^mok bench: --ring-rows 100: expected a multiple of 128 \(0: automatic\)$" \
  bench --ring-rows 100
# mok run --json: the path is checked before any work.
expect 2 "^mok run: --json needs a file name, got ''$" run --json ""
expect 1 "^mok run: unsupported: --json /nonexistent-dir/r.json: cannot write the file$" \
  run --preset tiny --json /nonexistent-dir/r.json
# mok trace --help: the precisions it records, one heading for the layer.
if "$mok" trace --help | grep -q "mxfp8" || [ "$("$mok" trace --help | grep -c "the layer")" != 1 ]; then
  echo "FAIL: mok trace --help lists mxfp8 or repeats the layer's heading"
  failures=$((failures + 1))
fi
# A layer by its numbers runs (the CPU reference without a GPU); the header names the EP size.
out="$("$mok" run --hidden 256 --intermediate 192 --experts 8 --top-k 2 --shared-experts 1 \
  --tokens 24 --ep 2 2>&1)"
if [ $? != 0 ] || ! grep -q "^mok run: layer 256x192x8/2+192, T=24 tokens, .* EP=2 " <<<"$out"; then
  echo "FAIL: mok run on a layer by its numbers: ${out%%$'\n'*}"
  failures=$((failures + 1))
fi
# --json writes every check with its value and bound, the layer, the machine and the date.
json="$(mktemp)"
if ! "$mok" run --preset tiny --tokens 24 --ep 2 --json "$json" >/dev/null 2>&1 ||
  ! python3 - "$json" <<'PY'; then
import json, sys
r = json.load(open(sys.argv[1]))
assert r["passed"] is True and r["layer"]["tokens"] == 24 and r["layer"]["ep_checked"] == 2
assert r["commit"] == "unknown" or len(r["commit"].split("+")[0]) == 12, r["commit"]
names = [c["name"] for c in r["checks"]]
assert "out vs FP64 (relative L2)" in names and "EP=2 vs EP=1 (out, d_x, d_w, routed dW)" in names
out = r["checks"][names.index("out vs FP64 (relative L2)")]
assert 0 < out["value"] < out["bound"], out
assert any(m["name"] == "CPU reference forward" and m["value"] > 0 for m in r["throughput"])
clocks = r["clocks"]  # measured while timed GPU work ran: none on the CPU reference alone
assert clocks["samples"] > 0 or clocks["unavailable"], clocks
assert clocks["samples"] == 0 or 100 < clocks["sm_mhz"]["median"] <= clocks["sm_mhz"]["max"], clocks
PY
  echo "FAIL: mok run --json"
  failures=$((failures + 1))
fi
rm -f "$json"
# mok bench --sweep N: random shapes, the BF16 forward at EP = 1 only; --seed belongs to it.
expect 2 "^mok bench: --sweep 0: expected an integer in \[1, 1000\]$" bench --sweep 0
expect 2 "^mok bench: --sweep N draws its own shapes" bench --sweep 3 --preset fine
expect 2 "^mok bench: --sweep N draws its own shapes" bench --preset all --sweep 3
expect 2 "^mok bench: --sweep times the BF16 forward at EP = 1" bench --sweep 3 --ep 2
expect 2 "^mok bench: --shapes A-B selects from --sweep N" bench --shapes 1-2
expect 2 "^mok bench: --shapes 2-3: the sweep has shapes 0 to 2$" bench --sweep 3 --shapes 2-3
expect 2 "^mok bench: --shapes 3: expected A-B" bench --sweep 4 --shapes 3
expect 2 "^mok bench: --shapes 2-1: expected A-B, .* 0 <= A <= B <= 999$" bench --sweep 4 --shapes 2-1
# mok run past the CPU reference: the GPU megakernels on sampled tokens, or the reason neither runs.
if "$mok" info | grep -q "GPUs    no GPU"; then
  expect 1 "^mok run: unsupported: the CPU reference keeps parameters and gradients in FP64: .* \(GPU: (no GPU|this build has no CUDA kernels \(configured without nvcc\))\)$" \
    run --preset qwen3-30b
else
  out="$("$mok" run --preset qwen3-30b --tokens 512 2>&1)"
  if [ $? != 0 ] || ! grep -q "^mok run: all checks passed$" <<<"$out" ||
    ! grep -q "GPU backward d_x vs reference (sampled) .*PASS" <<<"$out"; then
    echo "FAIL: mok run --preset qwen3-30b on the GPU: $(tail -3 <<<"$out")"
    failures=$((failures + 1))
  fi
fi
if "$mok" info | grep -q "GPUs    no GPU"; then
  expect 1 "needs a .*GPU" bench --sweep 2 --seed 5
  expect 1 "needs a .*GPU" bench --preset tiny --seed 3 --routing skewed
  # Every precision goes to the EP bench (once refused as "EP = 1 only"); here it stops at the GPU.
  expect 1 "needs a .*GPU" bench --precision fp8_block --ep 2 --preset tiny
fi
# --direction backward stays EP = 1, in every precision.
expect 2 "^mok bench: --direction backward times the EP = 1 layer" \
  bench --precision mxfp8 --direction backward --ep 2
# mok bench --json: the path is checked before any GPU work; without a GPU the bench's own error
# and no file left behind; with one, every printed table in the JSON, numbers as numbers.
expect 2 "^mok bench: --json needs a value$" bench --json
expect 1 "^mok bench: unsupported: --json /nonexistent-dir/b.json: cannot write the file$" \
  bench --preset tiny --json /nonexistent-dir/b.json
json="$(mktemp -u)"
if "$mok" info | grep -q "GPUs    no GPU"; then
  expect 1 "needs a .*GPU" bench --preset tiny --iterations 2 --json "$json"
  if [ -e "$json" ]; then
    echo "FAIL: mok bench --json left $json without a GPU"
    failures=$((failures + 1))
  fi
elif ! "$mok" bench --preset tiny --iterations 2 --json "$json" >/dev/null 2>&1 ||
  ! python3 - "$json" <<'PY'; then
import json, sys
r = json.load(open(sys.argv[1]))
assert r["exit_code"] == 0 and r["command"].startswith("mok bench --preset tiny"), r["command"]
main = r["tables"][0]
assert main["columns"][:4] == ["shape", "T", "rows/expert", "forward ms"], main["columns"]
row = main["rows"][0]
assert row[0] == "tiny" and row[1] == 512 and row[3] > 0, row
clocks = r["clocks"]  # NVML's, while the bench timed: the SM clock in a plausible range
assert clocks["samples"] > 0 and 100 < clocks["sm_mhz"]["min"] <= clocks["sm_mhz"]["max"] < 4000, clocks
assert clocks["memory_mhz"]["median"] > 100, clocks
PY
  echo "FAIL: mok bench --json on the GPU"
  failures=$((failures + 1))
fi
rm -f "$json"
# mok trace: its own options, checked before any GPU work; on a GPU a Chrome trace with every role.
expect 0 "^usage: mok trace \[options\]$" trace --help
expect 2 "^mok trace: --events 0: expected an integer in \[1, 268435456\]$" trace --events 0
expect 2 "^mok trace: --precision fp8_block with --direction forward: mok trace records the BF16 forward and backward and the fp8_block backward$" \
  trace --precision fp8_block
expect 2 "^mok trace: --precision mxfp8 with --direction backward: mok trace records" \
  trace --precision mxfp8 --direction backward
expect 2 "^mok trace: --ep 3: expected one of 1, 2, 4, 8$" trace --ep 3
expect 2 "^mok trace: --ep 8: expected a divisor of the 20 experts$" \
  trace --hidden 256 --intermediate 128 --experts 20 --top-k 2 --ep 8
expect 2 "^mok trace: --ep 2 with --precision fp8_block: the emulated group's timeline runs BF16$" \
  trace --ep 2 --direction backward --precision fp8_block
expect 2 "^mok trace: --out needs a file name, got ''$" trace --out ""
expect 2 "^mok trace: --png needs a file name, got ''$" trace --png ""
expect 2 "^mok trace: --direction sideways: expected one of forward, backward$" \
  trace --direction sideways
trace="$(mktemp -u).json"
if "$mok" info | grep -q "GPUs    no GPU"; then
  expect 1 "needs a .*GPU" trace --preset tiny --out "$trace"
  expect 1 "needs a .*GPU" trace --preset tiny --direction backward --out "$trace"
  # An explicit --png needs its plotter (python3 with matplotlib), said before the GPU is looked
  # for; a build without the CUDA kernels says that first.
  png=/tmp/mok_cli_check.png
  if "$mok" trace --preset tiny --out "$trace" 2>&1 | grep -q "needs a build with CUDA"; then
    expect 1 "^mok trace: unsupported: mok trace needs a build with CUDA" trace --png "$png"
  elif python3 -c "import matplotlib" 2>/dev/null; then
    expect 1 "^mok trace: unsupported: mok trace needs a GPU" trace --png "$png"
  else
    expect 1 "^mok trace: unsupported: --png $png: cannot draw it: python3 with matplotlib is not found$" \
      trace --png "$png"
  fi
else
  for run in "forward bf16 1" "backward bf16 1" "backward fp8_block 1" "forward bf16 4" \
    "backward bf16 2"; do
    read -r direction precision ep <<<"$run"
    if ! "$mok" trace --preset tiny --direction $direction --precision $precision --ep $ep \
      --out "$trace" >/dev/null 2>&1 ||
      ! python3 - "$trace" $direction $ep <<'PY'; then
import json, sys
events = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e["ph"] == "X"]
assert {e["pid"] for e in events} == set(range(int(sys.argv[3]))), "a process per rank"
names = ("producer", "consumer 0", "consumer 1", "dispatch", "combine", "store")
roles = {r for e in events for r in names if e["name"].startswith(r + " ")}
want = {"producer", "consumer 0", "consumer 1", "combine"}
kinds = {e["args"]["kind"] for e in events if "kind" in e["args"]}
if sys.argv[2] == "backward":
    want |= {"dispatch", "store"}
    assert {"dgrad down", "dgrad gate/up", "wgrad down", "wgrad gate/up"} <= kinds, kinds
else:
    assert {"routed gate/up", "routed down"} <= kinds, kinds
assert want <= roles, roles
PY
      echo "FAIL: mok trace --direction $direction --precision $precision --ep $ep on the GPU"
      failures=$((failures + 1))
    fi
  done
fi
rm -f "$trace"
[ "$failures" = 0 ] && echo "all CLI checks passed"
exit $((failures > 0))
