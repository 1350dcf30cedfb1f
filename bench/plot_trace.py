"""The timeline of `mok trace` as a PNG: one row per track (an SM's producer, consumer
warpgroups, dispatch and combine, per rank), one bar per event, coloured by role:

  python3 bench/plot_trace.py mok_trace.json -o mok_trace.png [--sms 120-131] [--by-kind]

--by-kind colours the GEMM tiles (producer, consumers, the backward's store warp) by their tile
kind (dgrad down, wgrad gate/up, ...) instead of by role.

Reads the Chrome / Perfetto trace that `mok trace --out FILE` writes (it opens in
ui.perfetto.dev or chrome://tracing as it is).
"""
import argparse
import json
import sys

COLOURS = {"producer": "#9467bd", "consumer 0": "#1f77b4", "consumer 1": "#17becf",
           "dispatch": "#ff7f0e", "combine": "#2ca02c", "store": "#8c564b"}
KIND_PALETTE = ("#1f77b4", "#d62728", "#9467bd", "#17becf", "#bcbd22", "#e377c2", "#7f7f7f")


def role_of(name):
    """'consumer 0 1234' -> 'consumer 0' (the event's name is its role and what it worked on)."""
    for role in COLOURS:
        if name.startswith(role + " "):
            return role
    return name.rsplit(" ", 1)[0]


def read_trace(trace, by_kind=False):
    """{(pid, tid): [(start_us, duration_us, label)]} and the tracks' names; the label is the
    event's role, or with by_kind its tile kind where it has one."""
    tracks, names = {}, {}
    for e in trace["traceEvents"]:
        key = (e["pid"], e["tid"])
        if e["ph"] == "M" and e["name"] == "thread_name":
            names[key] = e["args"]["name"]
        elif e["ph"] == "X":
            kind = e.get("args", {}).get("kind") if by_kind else None
            tracks.setdefault(key, []).append((e["ts"], e["dur"], kind or role_of(e["name"])))
    if not tracks:
        raise ValueError("no events in the trace")
    return tracks, names


def sm_range(text):
    """'120-131' (or '7') -> (120, 131), for --sms."""
    first, _, last = text.partition("-")
    try:
        lo, hi = int(first), int(last or first)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--sms {text!r}: expected FIRST-LAST, e.g. 120-131")
    if lo < 0 or hi < lo:
        raise argparse.ArgumentTypeError(f"--sms {text!r}: expected 0 <= FIRST <= LAST")
    return lo, hi


def only_sms(tracks, names, sms):
    """The tracks of SMs sms[0]..sms[1] (named 'SM n role' by mok trace)."""
    def sm_of(key):
        words = names.get(key, "").split()
        return int(words[1]) if len(words) > 1 and words[0] == "SM" else None
    kept = {k: v for k, v in tracks.items()
            if sm_of(k) is not None and sms[0] <= sm_of(k) <= sms[1]}
    if not kept:
        raise ValueError(f"no tracks of SMs {sms[0]}-{sms[1]} in the trace")
    return kept


def plot(tracks, names, title, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted(tracks)
    colours = {}  # label -> colour: the roles', then each tile kind's in order of appearance
    for events in tracks.values():
        for _, _, label in events:
            if label not in colours:
                colours[label] = COLOURS.get(label) or KIND_PALETTE[
                    sum(1 for k in colours if k not in COLOURS) % len(KIND_PALETTE)]
    fig, ax = plt.subplots(figsize=(12, min(0.06 * len(keys) + 1.5, 40)))
    for row, key in enumerate(keys):
        for label, colour in colours.items():
            bars = [(s, d) for s, d, r in tracks[key] if r == label]
            if bars:
                ax.broken_barh(bars, (row - 0.4, 0.8), facecolors=colour, linewidth=0)
    ax.set_ylim(-1, len(keys))
    ax.invert_yaxis()
    step = max(1, len(keys) // 40)
    ax.set_yticks(range(0, len(keys), step))
    ax.set_yticklabels([f"rank {keys[i][0]} {names.get(keys[i], keys[i][1])}"
                        for i in range(0, len(keys), step)], fontsize=6)
    ax.set_xlabel("microseconds from the first event")
    ax.set_title(title, fontsize=9)
    handles = [matplotlib.patches.Patch(color=c, label=r) for r, c in colours.items()]
    ax.legend(handles=handles, fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", help="`mok trace --out` file")
    ap.add_argument("-o", "--output", required=True, help="PNG to write")
    ap.add_argument("--title", help="default: the direction's, from the trace's tile kinds")
    ap.add_argument("--sms", type=sm_range, help="only these SMs' tracks, FIRST-LAST")
    ap.add_argument("--by-kind", action="store_true", help="colour GEMM tiles by tile kind")
    args = ap.parse_args(argv)
    with open(args.trace) as f:
        trace = json.load(f)
    tracks, names = read_trace(trace, by_kind=args.by_kind)
    if args.title is None:  # the backward's tiles are dgrad and wgrad kinds
        kinds = {e.get("args", {}).get("kind", "") for e in trace["traceEvents"]}
        backward = any(k.startswith(("dgrad", "wgrad")) for k in kinds)
        args.title = f"mok {'backward' if backward else 'forward'}: the in-kernel timeline"
    if args.sms:
        tracks = only_sms(tracks, names, args.sms)
    events = sum(len(v) for v in tracks.values())
    plot(tracks, names, args.title, args.output)
    print(f"wrote {args.output}: {len(tracks)} tracks, {events} events")
    return 0


if __name__ == "__main__":
    sys.exit(main())
