"""bench/plot_bench.py on `mok bench --json` reports: the main table found by its columns, the
numbers read as printed (percentages too), PyTorch's printed table joined by shape, a PNG."""
import importlib.util
import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = pathlib.Path(__file__).resolve().parent / "data"

COLUMNS = ["shape", "T", "rows/expert", "forward ms", "TFLOP/s", "% of BF16 peak",
           "roofline ms (bound)", "% of roofline", "cuBLAS unfused TFLOP/s", "mok / cuBLAS",
           "mok staged TFLOP/s", "outputs differ by", "peak TFLOP/s, HBM TB/s measured",
           "row path"]


def load():
    spec = importlib.util.spec_from_file_location("plot_bench", ROOT / "bench" / "plot_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def report(rows):
    return {"device": "NVIDIA H200", "date": "2026-12-04T16:00:00Z", "tables": [
        {"title": "a wait profile", "columns": ["shape", "T", "ms"], "rows": [["x", 1, 2.0]]},
        {"title": "Routing: random", "columns": COLUMNS, "rows": rows}]}


def test_reads_the_main_table_by_its_columns(tmp_path, capsys):
    pb = load()
    rows = [["qwen3-30b", 8192, 512, 1.384, 447, "45%", "0.9 (HBM)", "65%", 223, 2.0, 300,
             "1.0e-02", "990, 4.10", "gather"],
            ["fine", 4096, 80, 1.068, 265, "27%", "0.5 (FLOPs)", "47%", 137, 1.93, 201,
             "1.0e-02", "990, 4.10", "gather"]]
    got = pb.read_bench(report(rows))
    assert got == [("qwen3-30b", 8192, {"mok": 447, "mok staged": 300, "cuBLAS unfused": 223,
                                        "% of roofline": 65}),
                   ("fine", 4096, {"mok": 265, "mok staged": 201, "cuBLAS unfused": 137,
                                   "% of roofline": 47})]
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report(rows)))
    pytest.importorskip("matplotlib")
    png = tmp_path / "b.png"
    assert pb.main([str(path), "--torch", str(DATA / "torch_ep1.txt"), "-o", str(png)]) == 0
    out = capsys.readouterr().out
    # torch_ep1.txt prints qwen3-30b at T = 8192: 188 and fine at T = 4096: 117.
    assert "| qwen3-30b | 8192 | 447 | 300 | 223 | 188 | 65% |" in out
    assert "| fine | 4096 | 265 | 201 | 137 | 117 | 47% |" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_report_without_the_forward_table_is_refused(tmp_path):
    pb = load()
    with pytest.raises(ValueError, match="no table with the columns"):
        pb.read_bench({"tables": [{"title": "", "columns": ["shape", "T"], "rows": []}]})


def test_reads_a_real_report():
    """docs/data/session28/bench_qwen3-30b.json, written by `mok bench --json` on an H200
    (s28e), whose printed row was '| qwen3-30b | 8192 | 512 | 1.323 | 467 | 59% | 0.780
    (compute) | 59% | 192 | 2.43 | 401 | ...'."""
    pb = load()
    with open(ROOT / "docs" / "data" / "session28" / "bench_qwen3-30b.json") as f:
        got = pb.read_bench(json.load(f))
    assert got == [("qwen3-30b", 8192, {"mok": 467, "mok staged": 401, "cuBLAS unfused": 192,
                                        "% of roofline": 59})]
