"""The PyTorch baselines' shape arguments (bench/torch_shapes.py): the standard shapes, one of
them at other token counts, or a layer by its numbers; bad ones exit with a usage error."""
import argparse
import os
import sys

import pytest

pytest.importorskip("torch")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import torch_shapes  # noqa: E402


def shapes(*argv):
    ap = argparse.ArgumentParser()
    torch_shapes.add_shape_arguments(ap)
    return torch_shapes.selected_shapes(ap, ap.parse_args(list(argv)))


def test_every_standard_shape_by_default_and_one_by_name():
    assert [n for n, _ in shapes()] == list(torch_shapes.SHAPES)
    assert shapes("--shape", "qwen3-30b", "--tokens", "512") == [
        ("qwen3-30b", (2048, 768, 128, 8, 0, 512))]


def test_a_layer_by_its_numbers():
    assert shapes("--hidden", "1024", "--intermediate", "256", "--experts", "64", "--top-k", "6",
                  "--shared-width", "512") == [("1024x256x64/6", (1024, 256, 64, 6, 512, 4096))]


@pytest.mark.parametrize("argv", [["--hidden", "1024"], ["--shape", "nope"],
                                  ["--hidden", "1024", "--intermediate", "256", "--experts", "4",
                                   "--top-k", "8"], ["--shape", "fine", "--tokens", "0"]])
def test_bad_shapes_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as e:
        shapes(*argv)
    assert e.value.code == 2
    assert "error:" in capsys.readouterr().err
