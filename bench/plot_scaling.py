"""Per-GPU TFLOP/s against expert-parallel size, mok beside PyTorch, from the benchmarks' printed
tables (tokens per rank fixed):

  python3 bench/plot_scaling.py --mok ep2.txt ep4.txt ep8.txt --torch torch_ep1.txt torch_ep2.txt \\
      torch_ep4.txt torch_ep8.txt -o docs/scaling.png

--mok: outputs of `mok bench --ep N` (each also gives EP = 1, the single-GPU kernel, same T);
--torch: outputs of `python3 bench/torch_moe_forward.py` (EP = 1) and of `torchrun
--nproc-per-node N bench/torch_ep_forward.py` (EP = N). Prints the series as a table and writes
the PNG (needs matplotlib).
"""
import argparse
import re
import sys


def table_rows(text):
    """The rows of the first markdown table whose header starts with '| shape |': dicts by
    column name. Lines between its rows that are not table rows (a launcher's warnings) are
    skipped; the next '| shape |' header ends it."""
    lines = [line.strip() for line in text.splitlines()]
    for i, line in enumerate(lines):
        if line.startswith("| shape |"):
            header = [c.strip() for c in line.strip("|").split("|")]
            rows = []
            for row in lines[i + 1:]:
                if row.startswith("| shape |"):
                    break
                cells = [c.strip() for c in row.strip("|").split("|")]
                if row.startswith("|") and len(cells) == len(header) and not cells[0].startswith("-"):
                    rows.append(dict(zip(header, cells)))
            if not rows:
                raise ValueError("the '| shape |' table has no rows")
            return rows
    raise ValueError("no '| shape |' table in the input")


def shape_key(name, tokens):
    """The PyTorch scripts name dsv3 at T = 8192 'dsv3-8k'; mok names it 'dsv3' with T."""
    return (re.sub(r"-\d+k$", "", name), int(tokens))


def parse_mok(text):
    """{ep: {(shape, T): TFLOP/s per GPU}} from one `mok bench --ep N` output (N and 1)."""
    m = re.search(r"mok bench --ep (\d+)", text)
    if not m:
        raise ValueError("not a `mok bench --ep N` output (no 'mok bench --ep N' line)")
    ep = int(m.group(1))
    out = {ep: {}, 1: {}}
    for r in table_rows(text):
        key = shape_key(r["shape"], r["T per rank"])
        out[ep][key] = float(r["TFLOP/s per GPU"])
        out[1][key] = float(r["EP=1 TFLOP/s"])
    return out


def parse_torch(text):
    """{ep: {(shape, T): TFLOP/s per GPU}} from a PyTorch baseline's output."""
    m = re.search(r"EP = (\d+)", text)
    ep = int(m.group(1)) if m else 1
    rows = table_rows(text)
    out = {ep: {}}
    for r in rows:
        tokens = r.get("T per rank", r.get("T"))
        tflops = r.get("TFLOP/s per GPU", r.get("TFLOP/s"))
        out[ep][shape_key(r["shape"], tokens)] = float(tflops)
    return out


def merge(parsed):
    series = {}
    for p in parsed:
        for ep, values in p.items():
            series.setdefault(ep, {}).update(values)
    return series


def plot(mok, torch, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted({k for v in list(mok.values()) + list(torch.values()) for k in v})
    fig, axes = plt.subplots(1, len(keys), figsize=(3.2 * len(keys), 3.4), squeeze=False)
    for ax, key in zip(axes[0], keys):
        for label, series, style in (("mok", mok, "o-"), ("PyTorch", torch, "s--")):
            eps = sorted(ep for ep in series if key in series[ep])
            ax.plot(eps, [series[ep][key] for ep in eps], style, label=label)
        ax.set_title(f"{key[0]}, T = {key[1]} per rank", fontsize=9)
        ax.set_xlabel("EP size (GPUs)")
        ax.set_xscale("log", base=2)
        ax.set_xticks([1, 2, 4, 8])
        ax.set_xticklabels(["1", "2", "4", "8"])
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("TFLOP/s per GPU")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mok", nargs="+", required=True, help="`mok bench --ep N` outputs")
    ap.add_argument("--torch", nargs="*", default=[], help="PyTorch baseline outputs")
    ap.add_argument("-o", "--output", help="PNG to write")
    args = ap.parse_args(argv)
    mok = merge(parse_mok(open(f).read()) for f in args.mok)
    torch = merge(parse_torch(open(f).read()) for f in args.torch)
    eps = sorted(set(mok) | set(torch))
    keys = sorted({k for v in mok.values() for k in v})
    print("| shape | T per rank | " + " | ".join(f"EP={e} mok / PyTorch" for e in eps) + " |")
    print("|---|---|" + "---|" * len(eps))
    for key in keys:
        cells = []
        for e in eps:
            a, b = mok.get(e, {}).get(key), torch.get(e, {}).get(key)
            cells.append(f"{a:.0f}" if a is not None else "-")
            cells[-1] += f" / {b:.0f}" if b is not None else " / -"
        print(f"| {key[0]} | {key[1]} | " + " | ".join(cells) + " |")
    if args.output:
        plot(mok, torch, args.output)
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
