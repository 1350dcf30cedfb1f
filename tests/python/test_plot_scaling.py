"""bench/plot_scaling.py on printed outputs of real runs (two H200s, kept in tests/python/data):
the numbers it reads must be the ones those outputs print, and the plot must be a PNG with one
panel per shape."""
import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = pathlib.Path(__file__).resolve().parent / "data"


def load():
    spec = importlib.util.spec_from_file_location("plot_scaling", ROOT / "bench" / "plot_scaling.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reads_mok_ep_and_its_single_gpu_column():
    ps = load()
    mok = ps.parse_mok((DATA / "mok_bench_ep2.txt").read_text())
    assert sorted(mok) == [1, 2]
    assert len(mok[2]) == 5
    assert mok[2][("dsv3", 8192)] == 473 and mok[1][("dsv3", 8192)] == 441
    assert mok[2][("fine", 4096)] == 143 and mok[1][("qwen3-30b", 8192)] == 345


def test_reads_pytorch_tables_through_launcher_noise_and_shape_aliases():
    ps = load()
    ep2 = ps.parse_torch((DATA / "torch_ep2.txt").read_text())  # torchrun warnings inside
    ep1 = ps.parse_torch((DATA / "torch_ep1.txt").read_text())
    assert ep2[2][("dsv3", 8192)] == 280  # printed as 'dsv3-8k'
    assert ep2[2][("qwen3-30b", 8192)] == 114 and len(ep2[2]) == 5
    assert ep1[1][("dsv3", 4096)] == 231 and ep1[1][("mok-default", 2048)] == 108


def test_rejects_text_without_a_table():
    ps = load()
    with pytest.raises(ValueError):
        ps.parse_torch("PyTorch, EP = 2: nothing ran\n")
    with pytest.raises(ValueError):
        ps.parse_mok("| shape | T per rank |\n|---|---|\n")  # no 'mok bench --ep N' line


def test_writes_a_png_with_every_shape(tmp_path, capsys):
    ps = load()
    out = tmp_path / "scaling.png"
    ps.main(["--mok", str(DATA / "mok_bench_ep2.txt"), "--torch", str(DATA / "torch_ep1.txt"),
             str(DATA / "torch_ep2.txt"), "-o", str(out)])
    printed = capsys.readouterr().out
    assert "| dsv3 | 8192 | 441 / 335 | 473 / 280 |" in printed
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width = int.from_bytes(data[16:20], "big")
    assert width >= 5 * 300  # five panels side by side
