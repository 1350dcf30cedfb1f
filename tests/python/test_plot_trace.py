"""bench/plot_trace.py on a trace in the form `mok trace --out` writes: events grouped by track,
roles read from the event names, metadata names kept, a PNG."""
import importlib.util
import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def load():
    spec = importlib.util.spec_from_file_location("plot_trace", ROOT / "bench" / "plot_trace.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TRACE = {"displayTimeUnit": "ns", "traceEvents": [
    {"name": "consumer 0 7", "ph": "X", "pid": 0, "tid": 1, "ts": 0.5, "dur": 2.0,
     "args": {"what": 7}},
    {"name": "consumer 0 8", "ph": "X", "pid": 0, "tid": 1, "ts": 4.5, "dur": 4.0,
     "args": {"what": 8}},
    {"name": "dispatch 0", "ph": "X", "pid": 0, "tid": 19, "ts": 0.0, "dur": 1.0,
     "args": {"what": 0}},
    {"name": "thread_name", "ph": "M", "pid": 0, "tid": 1, "args": {"name": "SM 0 consumer 0"}},
    {"name": "thread_name", "ph": "M", "pid": 0, "tid": 19, "args": {"name": "SM 2 dispatch"}}]}


def test_groups_events_by_track_and_role(tmp_path, capsys):
    pt = load()
    tracks, names = pt.read_trace(TRACE)
    assert tracks == {(0, 1): [(0.5, 2.0, "consumer 0"), (4.5, 4.0, "consumer 0")],
                      (0, 19): [(0.0, 1.0, "dispatch")]}
    assert names == {(0, 1): "SM 0 consumer 0", (0, 19): "SM 2 dispatch"}
    pytest.importorskip("matplotlib")
    path = tmp_path / "t.json"
    path.write_text(json.dumps(TRACE))
    png = tmp_path / "t.png"
    assert pt.main([str(path), "-o", str(png)]) == 0
    assert "2 tracks, 3 events" in capsys.readouterr().out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_empty_trace_is_refused():
    with pytest.raises(ValueError, match="no events"):
        load().read_trace({"traceEvents": []})


def test_sms_keeps_only_those_tracks_and_refuses_an_empty_choice(tmp_path, capsys):
    pt = load()
    tracks, names = pt.read_trace(TRACE)
    assert pt.only_sms(tracks, names, pt.sm_range("1-2")) == {(0, 19): [(0.0, 1.0, "dispatch")]}
    assert pt.only_sms(tracks, names, pt.sm_range("0")) == {
        (0, 1): [(0.5, 2.0, "consumer 0"), (4.5, 4.0, "consumer 0")]}
    with pytest.raises(ValueError, match="no tracks of SMs 5-9"):
        pt.only_sms(tracks, names, (5, 9))
    for bad in ("x", "3-1", "-2"):
        with pytest.raises(Exception, match="--sms"):
            pt.sm_range(bad)


def test_by_kind_labels_gemm_events_by_their_tile_kind(tmp_path):
    pt = load()
    trace = {"traceEvents": TRACE["traceEvents"] + [
        {"name": "consumer 1 wgrad down 3", "ph": "X", "pid": 0, "tid": 2, "ts": 1.0, "dur": 1.5,
         "args": {"what": 3, "kind": "wgrad down"}}]}
    tracks, _ = pt.read_trace(trace, by_kind=True)
    assert tracks[(0, 2)] == [(1.0, 1.5, "wgrad down")]
    assert tracks[(0, 19)] == [(0.0, 1.0, "dispatch")]  # no kind: its role
    assert pt.read_trace(trace)[0][(0, 2)] == [(1.0, 1.5, "consumer 1")]
    pytest.importorskip("matplotlib")
    path = tmp_path / "k.json"
    path.write_text(json.dumps(trace))
    assert pt.main([str(path), "-o", str(tmp_path / "k.png"), "--by-kind"]) == 0


def test_trace_kinds_table(tmp_path, capsys):
    """bench/trace_kinds.py: per producer / consumer tile kind and per other role, the counts,
    the span, when the events ended and their durations, from a gzipped trace too."""
    import gzip
    spec = importlib.util.spec_from_file_location("trace_kinds", ROOT / "bench" / "trace_kinds.py")
    tk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tk)
    trace = {"traceEvents": [
        {"name": "consumer 0 dgrad down 3", "ph": "X", "ts": 1000.0, "dur": 500.0,
         "args": {"what": 3, "kind": "dgrad down"}},
        {"name": "consumer 1 dgrad down 3", "ph": "X", "ts": 1000.0, "dur": 1500.0,
         "args": {"what": 3, "kind": "dgrad down"}},
        {"name": "producer dgrad down 3", "ph": "X", "ts": 900.0, "dur": 100.0,
         "args": {"what": 3, "kind": "dgrad down"}},
        {"name": "dispatch 0", "ph": "X", "ts": 0.0, "dur": 2000.0, "args": {"what": 0}},
        {"name": "thread_name", "ph": "M", "args": {"name": "SM 0 dispatch"}}]}
    rows = tk.kind_rows(trace)
    assert [r[0] for r in rows] == ["C dgrad down", "P dgrad down", "dispatch"]
    c = rows[0]
    assert c[1:4] == (2, 1.0, 2.5) and c[4] == (1.5, 2.5, 2.5, 2.5)
    assert c[5] == 1000.0 and c[6] == 2.0
    assert rows[2][1:4] == (1, 0.0, 2.0)
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(trace, f)
    assert tk.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "| C dgrad down | 2 | 1.000 | 2.500 | 1.500 / 2.500 / 2.500 / 2.500 | 1000.00 | 2.000 |" in out
