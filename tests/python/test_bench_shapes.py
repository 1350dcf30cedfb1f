"""The PyTorch baselines' shape arguments (bench/torch_shapes.py): the standard shapes, one of
them at other token counts, or a layer by its numbers, and the tokens' routing (random, balanced,
skewed) and seed; bad ones exit with a usage error. The routing is drawn on the CPU here."""
import argparse
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
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


def routing_args(*argv):
    ap = argparse.ArgumentParser()
    torch_shapes.add_shape_arguments(ap)
    args = ap.parse_args(list(argv))
    torch_shapes.selected_shapes(ap, args)
    return args


@pytest.mark.parametrize("argv, named", [
    (["--zipf", "2"], "--zipf 2"), (["--routing", "balanced", "--zipf", "1"], "--zipf 1"),
    (["--routing", "skewed", "--zipf", "9"], "--zipf 9"),
    (["--routing", "skewed", "--zipf", "-0.5"], "--zipf -0.5"),
    (["--routing", "skewed", "--zipf", "nan"], "--zipf nan"),
    (["--routing", "skewed", "--zipf", "inf"], "--zipf inf"),
    (["--seed", "-1"], "--seed -1"), (["--seed", str(1 << 63)], str(1 << 63)),
    (["--routing", "zipfian"], "zipfian")])
def test_bad_routings_are_usage_errors_naming_the_value(argv, named, capsys):
    with pytest.raises(SystemExit) as e:
        routing_args(*argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and named in err


def test_routing_defaults_and_names():
    args = routing_args()
    assert (args.routing, args.seed) == ("random", 0)
    assert torch_shapes.routing_choice(args) == ("random", 1.0)
    assert torch_shapes.routing_name(torch_shapes.routing_choice(
        routing_args("--routing", "skewed"))) == "skewed (zipf 1.00)"
    args = routing_args("--routing", "skewed", "--zipf", "0", "--seed", "7")
    assert torch_shapes.routing_choice(args) == ("skewed", 0.0) and args.seed == 7
    assert torch_shapes.routing_name(("balanced", 1.0)) == "balanced"


def test_the_default_seed_is_the_one_the_scripts_always_used():
    args = routing_args()
    assert torch_shapes.generator(args, device="cpu").initial_seed() == 0
    assert torch_shapes.generator(args, 3, device="cpu").initial_seed() == 3  # the EP rank's
    args = routing_args("--seed", "5")
    assert torch_shapes.generator(args, 3, device="cpu").initial_seed() == 8


def test_random_routing_draws_what_make_layer_always_drew():
    h, i, e, k, s, t = 64, 32, 16, 4, 32, 50
    gen = torch_shapes.generator(routing_args(), device="cpu")
    p, x, got_ids, got_w = torch_shapes.make_layer(h, i, e, k, s, t, gen, device="cpu")
    # make_layer before the routing choices: weights, x, then softmax top-k of N(0, 1) logits.
    gen = torch.Generator().manual_seed(0)
    before = [torch.empty(*shape, dtype=torch.bfloat16).uniform_(-b, b, generator=gen)
              for shape, b in [((e, 2 * i, h), h**-0.5), ((e, h, i), i**-0.5),
                               ((2 * s, h), h**-0.5), ((h, s), s**-0.5), ((t, h), 1.0)]]
    w, ids = torch.topk(torch.softmax(torch.randn(t, e, generator=gen), -1), k, dim=-1)
    for a, b in zip([p["w13"], p["w2"], p["s13"], p["s2"], x], before):
        assert torch.equal(a, b)
    assert got_ids.dtype == torch.int64 and torch.equal(got_ids, ids)
    assert got_w.dtype == torch.float32
    assert torch.equal(got_w, (w / w.sum(-1, keepdim=True)).float())


def draw(kind, zipf=1.0, t=4096, e=64, k=6, seed=0):
    return torch_shapes.routing(t, e, k, torch.Generator().manual_seed(seed), (kind, zipf), "cpu")


def test_balanced_routing_is_round_robin_with_randoms_weights():
    t, e, k = 100, 24, 5
    ids, w = draw("balanced", t=t, e=e, k=k)
    assert ids.tolist() == [[(tok * k + j) % e for j in range(k)] for tok in range(t)]
    assert torch.equal(w, draw("random", t=t, e=e, k=k)[1])


def successive_shares(weights, k, n, rng):
    """Each expert's share of n tokens when each token takes k experts one by one without
    replacement, each with probability ~ weight among those left (the law Gumbel top-k samples)."""
    left = np.ones((n, len(weights)))
    for _ in range(k):
        cum = (left * weights).cumsum(1)
        pick = (cum <= rng.random((n, 1)) * cum[:, -1:]).sum(1)
        left[np.arange(n), pick] = 0
    return 1 - left.mean(0)


def test_skewed_routing_follows_zipf(rng):
    t, e, k = 4096, 64, 6
    ranks = torch_shapes.popularity_ranks(e)
    assert sorted(ranks.tolist()) == list(range(e))
    assert torch.equal(ranks, torch_shapes.popularity_ranks(e))  # fixed per E, not by a seed
    share = {}
    for zipf in (0.0, 2.0):
        ids, w = draw("skewed", zipf, t, e, k)
        assert ids.shape == (t, k) and w.shape == (t, k) and w.dtype == torch.float32
        assert all(len(set(row)) == k for row in ids.tolist())  # k distinct experts per token
        assert torch.allclose(w.sum(-1), torch.ones(t)) and bool((w > 0).all())
        # share[zipf][r]: the fraction of tokens routed to the expert of popularity rank r.
        share[zipf] = (torch.bincount(ids.view(-1), minlength=e).double()[ranks.argsort()] / t
                       ).numpy()
        expected = successive_shares((np.arange(e) + 1.0)**-zipf, k, 20000, rng)
        assert np.abs(share[zipf] - expected).max() < 0.04, zipf
    flat, steep = share[0.0], share[2.0]
    # zipf 0 is uniform: every expert near k / e = 0.094 of the tokens.
    assert flat.max() < 0.12 and flat.min() > 0.07
    # zipf 2: rank 0 is in nearly every token's k; rank 10, 121 times less likely per draw, is in
    # about 1 in 9 (k distinct draws reach far down the tail).
    assert steep[0] > 0.95 and steep[0] > 5 * steep[10]
    assert steep[0] > steep[1] > steep[3] > steep[10] > steep[40]
    # Another seed draws other tokens over the same hot experts (an EP group's ranks share them).
    ids1, _ = draw("skewed", 2.0, t, e, k, seed=1)
    assert not torch.equal(ids1, draw("skewed", 2.0, t, e, k)[0])
    assert int(torch.bincount(ids1.view(-1), minlength=e).argmax()) == int(ranks.argsort()[0])
