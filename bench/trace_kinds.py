"""When each tile kind of a `mok trace` timeline ran: per role and GEMM tile kind, the events, the
first start and last end, when 25 / 50 / 75 / 95% of them had ended, and the median and summed
durations (ms from the trace's first event; durations in us and ms):

  python3 bench/trace_kinds.py mok_trace.json [more.json.gz ...]

Reads the Chrome / Perfetto trace that `mok trace --out FILE` writes, plain or gzipped.
"""
import gzip
import json
import statistics
import sys


def kind_rows(trace):
    """[(group, events, first start, last end, (25, 50, 75, 95% ended), median us, sum ms)]; a
    group is a producer (P) or consumer (C) tile kind, or another role."""
    groups = {}
    for e in trace["traceEvents"]:
        if e["ph"] != "X":
            continue
        role = e["name"].split(" ")[0]
        kind = e.get("args", {}).get("kind")
        key = f"{'C' if role == 'consumer' else 'P'} {kind}" if kind else e["name"].rsplit(" ", 1)[0]
        groups.setdefault(key, []).append((e["ts"], e["dur"]))
    rows = []
    for key in sorted(groups):
        g = groups[key]
        ends = sorted(ts + dur for ts, dur in g)
        ended = tuple(ends[min(len(ends) - 1, int(f * len(ends)))] / 1e3 for f in (.25, .5, .75, .95))
        rows.append((key, len(g), min(ts for ts, _ in g) / 1e3, ends[-1] / 1e3, ended,
                     statistics.median(dur for _, dur in g), sum(dur for _, dur in g) / 1e3))
    return rows


def main(argv=None):
    paths = sys.argv[1:] if argv is None else argv
    if not paths:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    for path in paths:
        with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
            rows = kind_rows(json.load(f))
        print(f"{path}\n| group | events | first start | last end | 25 / 50 / 75 / 95% ended "
              "| median us | sum ms |\n|---|---|---|---|---|---|---|")
        for key, n, start, end, ended, median, total in rows:
            print(f"| {key} | {n} | {start:.3f} | {end:.3f} | "
                  f"{' / '.join(f'{t:.3f}' for t in ended)} | {median:.2f} | {total:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
