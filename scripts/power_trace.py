#!/usr/bin/env python3
"""Joins an nvidia-smi trace with `mok bench --sustain` spans: per sustained run, the median power,
the SM clock, the temperature and the clock-event (throttle) reasons active while it ran.

  nvidia-smi --query-gpu=timestamp,power.draw,clocks.sm,temperature.gpu,clocks_event_reasons.active \\
      --format=csv,noheader,nounits -lms 100 > trace.csv &
  mok bench --preset all --sustain 4 > bench.log; kill %1
  python3 scripts/power_trace.py trace.csv bench.log
"""
import datetime
import re
import statistics
import sys

# Bits of clocks_event_reasons.active (nvidia-smi -q documents them).
REASONS = {0x1: "idle", 0x2: "app clocks", 0x4: "SW power cap", 0x8: "HW slowdown",
           0x20: "SW thermal", 0x40: "HW thermal", 0x80: "HW power brake", 0x100: "display"}


def read_trace(path):
    samples = []
    for line in open(path):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 5:
            continue
        try:
            t = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            samples.append((t, float(parts[1]), float(parts[2]), float(parts[3]), int(parts[4], 16)))
        except ValueError:
            continue  # a header or a field the driver could not read
    return samples


def main():
    samples = read_trace(sys.argv[1])
    span = re.compile(r"sustained (.*): ([0-9.]+) to ([0-9.]+) s since the epoch, (\d+) runs, ([0-9.]+) ms")
    print("| run | ms each | samples | power W (median, max) | SM MHz (median, min-max) | °C | "
          "clock-event reasons (share of samples) |")
    print("|---|---|---|---|---|---|---|")
    for line in open(sys.argv[2]):
        m = span.search(line)
        if not m:
            continue
        what, start, end, ms = m.group(1), float(m.group(2)), float(m.group(3)), m.group(5)
        inside = [s for s in samples if start + 0.5 <= s[0] <= end]  # past the first half second
        if not inside:
            print(f"| {what} | {ms} | 0 | - | - | - | - |")
            continue
        power = [s[1] for s in inside]
        clock = [s[2] for s in inside]
        reasons = {}
        for s in inside:
            for bit, name in REASONS.items():
                if s[4] & bit:
                    reasons[name] = reasons.get(name, 0) + 1
        shares = ", ".join(f"{n} {100 * c // len(inside)}%" for n, c in sorted(reasons.items()))
        print(f"| {what} | {ms} | {len(inside)} | {statistics.median(power):.0f}, {max(power):.0f} | "
              f"{statistics.median(clock):.0f}, {min(clock):.0f}-{max(clock):.0f} | "
              f"{statistics.median(s[3] for s in inside):.0f} | {shares or 'none'} |")


if __name__ == "__main__":
    main()
