"""TFLOP/s per shape, mok's forward beside its baselines, and mok's % of the roofline, from
`mok bench --json` (one or more files, e.g. one per shape):

  python3 bench/plot_bench.py bench.json [more.json ...] [--torch torch.txt] -o docs/bench.png

The bars are the megakernel, mok's staged launches and the unfused cuBLAS pipeline (all from the
bench's main table, measured in the same call), and PyTorch's forward where --torch gives the
printed output of `python3 bench/torch_moe_forward.py` (a separate run: its bars are marked).
The label above mok's bar is its % of the roofline. Prints the series as a table and writes the
PNG (needs matplotlib).
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plot_scaling import shape_key, table_rows  # noqa: E402

MAIN_COLUMNS = ("shape", "T", "TFLOP/s", "% of roofline", "cuBLAS unfused TFLOP/s",
                "mok staged TFLOP/s")


def number(cell):
    """A cell as printed: a JSON number, or a string such as '45%'."""
    return float(cell.rstrip("%")) if isinstance(cell, str) else float(cell)


def read_bench(report):
    """[(shape, T, {series: value})] from one `mok bench --json` report's main table: the first
    table with every column of MAIN_COLUMNS."""
    for table in report["tables"]:
        columns = table["columns"]
        if all(c in columns for c in MAIN_COLUMNS):
            at = {c: columns.index(c) for c in MAIN_COLUMNS}
            if not table["rows"]:
                raise ValueError("the forward table has no rows")
            out = []
            for row in table["rows"]:
                out.append((row[at["shape"]], int(row[at["T"]]), {
                    "mok": number(row[at["TFLOP/s"]]),
                    "mok staged": number(row[at["mok staged TFLOP/s"]]),
                    "cuBLAS unfused": number(row[at["cuBLAS unfused TFLOP/s"]]),
                    "% of roofline": number(row[at["% of roofline"]]),
                }))
            return out
    raise ValueError("no table with the columns " + ", ".join(MAIN_COLUMNS) +
                     " (a `mok bench --json` report of the forward at EP = 1?)")


def read_torch(text):
    """{(shape, T): TFLOP/s} from a printed PyTorch baseline table."""
    return {shape_key(r["shape"], r["T"]): float(r["TFLOP/s"]) for r in table_rows(text)}


SERIES = (("mok", "#1f77b4"), ("mok staged", "#9ecae1"), ("cuBLAS unfused", "#ff7f0e"),
          ("PyTorch (separate run)", "#2ca02c"))


def plot(rows, title, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(min(1.9 * len(rows) + 2, 24), 3.6))
    shown = [(n, c) for n, c in SERIES if any(n in r[2] for r in rows)]
    width = 0.8 / len(shown)
    offset = [(s - (len(shown) - 1) / 2) * width for s in range(len(shown))]
    for s, (name, colour) in enumerate(shown):
        keep = [(i + offset[s], r[2][name]) for i, r in enumerate(rows) if name in r[2]]
        ax.bar([x for x, _ in keep], [v for _, v in keep], width, label=name, color=colour)
    for i, (_, _, v) in enumerate(rows):  # mok is the first series
        ax.annotate(f"{v['% of roofline']:.0f}%", (i + offset[0], v["mok"]),
                    ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([f"{shape}\nT = {t}" for shape, t, _ in rows], fontsize=8)
    ax.set_ylabel("TFLOP/s (design.md's FLOPs)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reports", nargs="+", help="`mok bench --json` files")
    ap.add_argument("--torch", help="printed output of bench/torch_moe_forward.py")
    ap.add_argument("-o", "--output", help="PNG to write")
    args = ap.parse_args(argv)
    rows, devices, dates = [], set(), set()
    for path in args.reports:
        with open(path) as f:
            report = json.load(f)
        rows += read_bench(report)
        devices.add(report.get("device", "?"))
        dates.add(report.get("date", "?")[:10])
    if args.torch:
        with open(args.torch) as f:
            torch = read_torch(f.read())
        for shape, t, v in rows:
            if shape_key(shape, t) in torch:
                v["PyTorch (separate run)"] = torch[shape_key(shape, t)]
    print("| shape | T | " + " | ".join(n for n, _ in SERIES) + " | mok % of roofline |")
    print("|---|---|" + "---|" * (len(SERIES) + 1))
    for shape, t, v in rows:
        cells = [f"{v[n]:.0f}" if n in v else "-" for n, _ in SERIES]
        print(f"| {shape} | {t} | " + " | ".join(cells) + f" | {v['% of roofline']:.0f}% |")
    if args.output:
        title = (f"mok forward (EP = 1, BF16) on {', '.join(sorted(devices))}, "
                 f"{', '.join(sorted(dates))}; label: % of the roofline")
        plot(rows, title, args.output)
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
