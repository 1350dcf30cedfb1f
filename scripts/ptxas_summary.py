#!/usr/bin/env python3
"""Registers, stack and spills of every kernel a build compiled, from the reports that
scripts/nvcc_guard.sh keeps beside each object (OBJECT.ptxas). A change's effect on register
pressure, read before any GPU run:

    python3 scripts/ptxas_summary.py build [--grep moe_backward] [--spills]

--grep keeps kernels whose demangled name contains the text; --spills only those that spill."""
import argparse
import os
import re
import shutil
import subprocess
import sys

ENTRY = re.compile(r"Compiling entry function '([^']+)'")
PROPERTIES = re.compile(r"Function properties for (\S+)")
FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"Used (\d+) registers")


def functions(path):
    """(mangled name, registers, stack, spill stores, spill loads) of each kernel in a report, and
    of each device function ptxas kept out of line (registers None: they count in the caller's)."""
    frames, registers, order = {}, {}, []
    entry = current = None
    with open(path) as f:
        for line in f:
            if m := ENTRY.search(line):
                entry = m.group(1)
            elif m := PROPERTIES.search(line):
                current = m.group(1)
                if current not in frames:
                    order.append(current)
                    frames[current] = (0, 0, 0)
            elif current and (m := FRAME.search(line)):
                frames[current] = tuple(int(g) for g in m.groups())
                current = None
            elif entry and (m := USED.search(line)):
                registers[entry] = int(m.group(1))
    return [(n, registers.get(n)) + frames[n] for n in order]


def demangle(names):
    tool = shutil.which("c++filt")
    if not tool or not names:
        return names
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True).stdout
    lines = out.splitlines()
    return lines if len(lines) == len(names) else names


def shorten(name):
    """Drops namespaces, the anonymous namespace's tag and the parameter list."""
    name = re.sub(r"\(anonymous namespace\)::", "", name)
    name = re.sub(r"\b\w+::", "", name)
    depth, end = 0, len(name)
    for i in range(len(name) - 1, -1, -1):  # the outermost trailing "(...)": the parameters
        if name[i] == ")":
            depth += 1
        elif name[i] == "(":
            depth -= 1
            if depth == 0:
                end = i
                break
    return name[:end]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build", help="the build folder (CMake's binary dir)")
    ap.add_argument("--grep", default="", help="only names that contain this")
    ap.add_argument("--spills", action="store_true", help="only kernels that spill")
    a = ap.parse_args()
    rows = []
    for root, _, files in os.walk(a.build):
        for f in sorted(files):
            if f.endswith(".ptxas"):
                path = os.path.join(root, f)
                source = os.path.basename(f[: -len(".ptxas")]).removesuffix(".o")
                rows += [(source,) + k for k in functions(path)]
    if not rows:
        sys.exit(f"no ptxas reports under {a.build} (built through scripts/nvcc_guard.sh?)")
    names = demangle([r[1] for r in rows])
    shown = 0
    print("| source | kernel | registers | stack B | spill stores B | spill loads B |")
    print("|---|---|---|---|---|---|")
    for r, name in sorted(zip(rows, names), key=lambda x: (x[0][0], x[1])):
        if a.grep not in name or (a.spills and r[4] == 0):
            continue
        regs = "(out of line)" if r[2] is None else r[2]
        print(f"| {r[0]} | {shorten(name)} | {regs} | {r[3]} | {r[4]} | {r[5]} |")
        shown += 1
    print(f"\n{shown} of {len(rows)} kernels and out-of-line functions", file=sys.stderr)


if __name__ == "__main__":
    main()
