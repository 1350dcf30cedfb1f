"""Every array argument of the NumPy module has one dtype and nothing is cast (a cast would wrap an
int64 id into range, truncate a float id, round a float scale or read int64 codes mod 256); a
config field of the wrong type is named; expert_bias's full shape is checked; mok.torch's CPU path
refuses ids the GPU layer refuses. Layout is not a type: non-contiguous arrays of the right dtype
give the contiguous array's result."""
import re

import numpy as np
import pytest

import mok

CFG = mok.preset("tiny")  # H 256, I 128, E 16, K 4, one shared expert of 128


def layer_inputs(rng, T=12):
    H, I, E, K = CFG["hidden"], CFG["intermediate"], CFG["num_experts"], CFG["top_k"]
    S = CFG["num_shared_experts"] * CFG["shared_intermediate"]
    p = {"shared_gate": rng.standard_normal((S, H)) * 0.05,
         "shared_up": rng.standard_normal((S, H)) * 0.05,
         "shared_down": rng.standard_normal((H, S)) * 0.05,
         "gate": rng.standard_normal((E, I, H)) * 0.05,
         "up": rng.standard_normal((E, I, H)) * 0.05,
         "down": rng.standard_normal((E, H, I)) * 0.05}
    x = rng.standard_normal((T, H))
    ids, w = mok.route_softmax_topk(rng.standard_normal((T, E)).astype(np.float32), K, True)
    return p, x, ids, w.astype(np.float64), rng.standard_normal((T, H))


def refused(arg, want, got):
    """pytest.raises for the TypeError naming the argument, the dtype expected and what came."""
    return pytest.raises(TypeError, match=rf"^{re.escape(arg)} must be a NumPy array of dtype "
                                          rf"{want}; got {re.escape(got)}$")


# --- dtypes: the module's documented dtype, or a TypeError; never a cast ----------------------

def test_reference_layer_refuses_ids_and_operands_of_another_dtype(rng):
    p, x, ids, w, d_out = layer_inputs(rng)
    # Cast to int32, 2^32 + id would run as expert id.
    with refused("topk_ids", "int32", "dtype int64"):
        mok.reference_layer(CFG, p, x, ids.astype(np.int64) + 2**32, w)
    with refused("topk_ids", "int32", "dtype float64"):  # cast, 3.9 would run as expert 3
        mok.reference_layer(CFG, p, x, ids + 0.9, w)
    with refused("topk_ids", "int32", "dtype int64"):
        mok.reference_layer(CFG, p, x, ids.astype(np.int64), w)
    with refused("x", "float64", "dtype float32"):
        mok.reference_layer(CFG, p, x.astype(np.float32), ids, w)
    with refused("topk_weights", "float64", "dtype float32"):
        mok.reference_layer(CFG, p, x, ids, w.astype(np.float32))
    with refused("d_out", "float64", "dtype float16"):
        mok.reference_layer(CFG, p, x, ids, w, d_out.astype(np.float16))
    with refused("params['down']", "float64", "dtype float32"):
        mok.reference_layer(CFG, {**p, "down": p["down"].astype(np.float32)}, x, ids, w)
    # An entry that is no array is named too.
    with refused("params['gate']", "float64", "list"):
        mok.reference_layer(CFG, {**p, "gate": p["gate"].tolist()}, x, ids, w)
    with refused("x", "float64", "list"):
        mok.reference_layer(CFG, p, x.tolist(), ids, w)


def test_dequantizers_refuse_codes_and_scales_of_another_dtype():
    d = np.zeros((4, 32), np.uint8)
    # Cast, the float scale 300.0 would become the uint8 scale 44.
    with refused("scales", "uint8", "dtype float32"):
        mok.dequantize_mxfp8(d, np.array([[300.0]] * 4, np.float32))
    with refused("data", "uint8", "dtype int64"):  # cast, codes would be read mod 256
        mok.dequantize_mxfp8(d.astype(np.int64) + 256, np.zeros((4, 1), np.uint8))
    with refused("scales", "uint8", "dtype int32"):
        mok.dequantize_nvfp4(np.zeros((4, 16), np.uint8), np.zeros((4, 2), np.int32), 1.0)
    with refused("scales", "float32", "dtype uint8"):
        mok.dequantize_fp8_block(np.zeros((4, 128), np.uint8), np.ones((4, 1), np.uint8))
    with refused("scales", "float32", "dtype float64"):
        mok.dequantize_fp8_block(np.zeros((4, 128), np.uint8), np.ones((4, 1), np.float64))
    with refused("data", "uint8", "dtype int8"):
        mok.dequantize_fp8_block(np.zeros((4, 128), np.int8), np.ones((4, 1), np.float32))


@pytest.mark.parametrize("decode", ["decode_e4m3", "decode_e5m2", "decode_e2m1", "decode_e8m0"])
def test_decoders_refuse_codes_that_are_not_uint8(decode):
    f = getattr(mok, decode)
    with refused("codes", "uint8", "dtype int64"):  # 300 decoded as 300 mod 256 = 44
        f(np.array([300]))
    with refused("codes", "uint8", "dtype bool"):
        f(np.zeros(3, bool))
    with refused("codes", "uint8", "list"):
        f([1, 2])


@pytest.mark.parametrize("name", ["encode_e4m3", "encode_e5m2", "encode_e2m1", "encode_bf16",
                                  "quantize_mxfp8", "quantize_nvfp4", "quantize_fp8_block"])
def test_encoders_and_quantizers_take_float32_only(name):
    f = getattr(mok, name)
    x = np.ones((4, 128))
    with refused("x", "float32", "dtype float64"):
        f(x)
    with refused("x", "float32", "dtype int64"):
        f(x.astype(np.int64))
    with refused("x", "float32", "dtype float16"):
        f(x.astype(np.float16))
    with refused("x", "float32", "ndarray of dtype >f4"):  # no DLPack: NumPy's own dtype name
        f(x.astype(">f4"))


def test_routers_take_float32_logits_and_bias():
    logits = np.zeros((2, 64), np.float32)
    with refused("logits", "float32", "dtype float64"):
        mok.route_softmax_topk(logits.astype(np.float64), 4)
    with refused("logits", "float32", "dtype float64"):
        mok.route_deepseek_v3(logits.astype(np.float64), None, 8, 8, 4)
    with refused("expert_bias", "float32", "dtype float64"):
        mok.route_deepseek_v3(logits, np.zeros(64), 8, 8, 4)


def test_route_deepseek_v3_checks_the_bias_shape_not_its_size():
    logits = np.zeros((2, 64), np.float32)
    # 64 elements in [8, 8] were taken as the bias of 64 experts.
    with pytest.raises(mok.Error, match=r"expert_bias must be \[E\] = \[64\]; got shape \[8, 8\]"):
        mok.route_deepseek_v3(logits, np.zeros((8, 8), np.float32), 8, 8, 4)
    with pytest.raises(mok.Error, match=r"expert_bias must be \[E\] = \[64\]; got shape \[1, 64\]"):
        mok.route_deepseek_v3(logits, np.zeros((1, 64), np.float32), 8, 8, 4)
    with pytest.raises(mok.Error, match=r"expert_bias must be \[E\] = \[64\]; got shape \[32\]"):
        mok.route_deepseek_v3(logits, np.zeros(32, np.float32), 8, 8, 4)
    ids, _ = mok.route_deepseek_v3(logits, np.zeros(64, np.float32), 8, 8, 4)
    assert ids.shape == (2, 8)


# --- layout: non-contiguous arrays of the right dtype are taken (copied), with the same result --

def strided(a):
    """a's values in a non-contiguous array (every other element of a larger one, last axis)."""
    big = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
    big[..., ::2] = a
    view = big[..., ::2]
    assert not view.flags.c_contiguous and np.array_equal(view, a)
    return view


def test_non_contiguous_arrays_give_the_contiguous_result(rng):
    p, x, ids, w, d_out = layer_inputs(rng)
    want = mok.reference_layer(CFG, p, x, ids, w, d_out, numerics="fp64")
    fortran = {k: np.asfortranarray(v) for k, v in p.items()}
    got = mok.reference_layer(CFG, fortran, strided(x), strided(ids), strided(w), strided(d_out),
                              numerics="fp64")
    assert want.keys() == got.keys()
    for k in want:
        assert np.array_equal(want[k], got[k]), k
    # Transposed views (the values of the right shape, not a transposed matrix) are fine too.
    t = mok.reference_layer(CFG, p, np.ascontiguousarray(x.T).T, np.ascontiguousarray(ids.T).T,
                            w, numerics="fp64")
    assert np.array_equal(t["out"], want["out"])

    a = rng.standard_normal((64, 256)).astype(np.float32)
    for q in (mok.quantize_mxfp8, mok.quantize_fp8_block, mok.quantize_nvfp4):
        for u, v in zip(q(a), q(strided(a))):
            assert np.array_equal(u, v), q.__name__
    data, scales = mok.quantize_mxfp8(a)
    assert np.array_equal(mok.dequantize_mxfp8(data, scales),
                          mok.dequantize_mxfp8(strided(data), strided(scales)))
    data, scales = mok.quantize_fp8_block(a)
    assert np.array_equal(mok.dequantize_fp8_block(data, scales),
                          mok.dequantize_fp8_block(np.asfortranarray(data), strided(scales)))
    data, scales, _, s_dec = mok.quantize_nvfp4(a)
    assert np.array_equal(mok.dequantize_nvfp4(data, scales, s_dec),
                          mok.dequantize_nvfp4(strided(data), strided(scales), s_dec))
    codes = np.arange(256, dtype=np.uint8).reshape(16, 16)
    assert np.array_equal(mok.decode_e4m3(strided(codes)), mok.decode_e4m3(codes), equal_nan=True)
    assert np.array_equal(mok.encode_e4m3(strided(a)), mok.encode_e4m3(a))
    logits = rng.standard_normal((8, 64)).astype(np.float32)
    bias = rng.standard_normal(64).astype(np.float32)
    for u, v in zip(mok.route_deepseek_v3(logits, bias), mok.route_deepseek_v3(strided(logits),
                                                                              strided(bias))):
        assert np.array_equal(u, v)
    # Read-only arrays are taken as well.
    ro = a.copy()
    ro.flags.writeable = False
    assert np.array_equal(mok.encode_bf16(ro), mok.encode_bf16(a))


def test_codecs_keep_the_input_shape():
    x = np.linspace(-3, 3, 24, dtype=np.float32).reshape(2, 3, 4)
    for enc, dec in ((mok.encode_e4m3, mok.decode_e4m3), (mok.encode_e5m2, mok.decode_e5m2),
                     (mok.encode_e2m1, mok.decode_e2m1)):
        codes = enc(x)
        assert codes.shape == (2, 3, 4) and codes.dtype == np.uint8
        assert np.array_equal(codes.reshape(-1), enc(x.reshape(-1)))
        assert dec(codes).shape == (2, 3, 4)
    assert mok.encode_bf16(x).shape == (2, 3, 4)
    assert mok.decode_e8m0(np.full((5, 1), 127, np.uint8)).tolist() == [[1.0]] * 5
    assert mok.encode_e4m3(np.array(1.0, np.float32)).shape == ()


# --- configuration dicts -------------------------------------------------------------------------

def test_config_check_is_public():
    assert mok.config_check(CFG) is None
    with pytest.raises(mok.Error, match="hidden = 65 is not allowed: a positive multiple of 64"):
        mok.config_check({**CFG, "hidden": 65})


@pytest.mark.parametrize("field,value,got", [
    ("hidden", 64.7, "float 64.7"),
    ("hidden", 256.0, "float 256.0"),
    ("hidden", "128", "str '128'"),
    ("top_k", True, "bool True"),
    ("num_experts", None, "NoneType None"),
    ("ring_rows", [128], "list [128]"),
])
def test_config_fields_of_the_wrong_type_are_named(field, value, got):
    with pytest.raises(TypeError, match=rf"^config field '{field}' must be an int; got "
                                        rf"{re.escape(got)}$"):
        mok.config_check({**CFG, field: value})


def test_config_fields_that_do_not_fit_are_named():
    with pytest.raises(mok.Error, match=r"^invalid config: hidden = 1099511627776 is not allowed: "
                                        r"outside the field's int32 range \[-2147483648, "
                                        r"2147483647\]$"):
        mok.config_check({**CFG, "hidden": 2**40})
    with pytest.raises(mok.Error, match=r"ring_rows = 1180591620717411303424 is not allowed: "
                                        r"outside the field's int64 range"):
        mok.config_check({**CFG, "ring_rows": 2**70})
    with pytest.raises(TypeError, match=r"^config field 'precision' must be a str \(allowed: bf16, "
                                        r"fp8_block, mxfp8, nvfp4\); got int 3$"):
        mok.config_check({**CFG, "precision": 3})
    with pytest.raises(TypeError, match=r"^config keys must be str \(mok.preset's field names\); "
                                        r"got int 1$"):
        mok.config_check({**CFG, 1: 2})
    # Integers of other types (NumPy's) are ints: taken.
    mok.config_check({**CFG, "hidden": np.int64(256), "ring_rows": np.int32(0)})


def test_reference_layer_names_a_bad_config_or_params_entry(rng):
    p, x, ids, w, _ = layer_inputs(rng)
    with pytest.raises(TypeError, match=r"config field 'hidden' must be an int; got str '256'"):
        mok.reference_layer({**CFG, "hidden": "256"}, p, x, ids, w)
    with refused("params['shared_up']", "float64", "int"):
        mok.reference_layer(CFG, {**p, "shared_up": 0}, x, ids, w)
    with pytest.raises(mok.Error, match=r"params has an unknown key 'gate_proj' \(allowed: "):
        mok.reference_layer(CFG, {**p, "gate_proj": p["gate"]}, x, ids, w)


# --- mok.torch's CPU path ------------------------------------------------------------------------

def test_torch_cpu_path_refuses_ids_that_are_not_int32():
    """The GPU layer refuses non-int32 ids; the CPU path cast them (.int()): float ids truncated,
    int64 ones wrapped. Needs PyTorch (skipped without it, as test_torch_moe.py)."""
    torch = pytest.importorskip("torch")
    import mok.torch as mt

    torch.manual_seed(0)
    m = mt.MoE(256, 128, 16, 4, max_tokens=8, dtype=torch.float64)
    x = torch.randn(8, 256, dtype=torch.float64)
    ids, w = m.route(x)
    params = [getattr(m, n) for n in mt.PARAMS]
    want = mt.moe(x, ids, w, params, m.config)
    for bad, got in ((ids.long(), "int64"), (ids.long() + 2**32, "int64"),
                     (ids.double() + 0.5, "float64")):
        with pytest.raises(mok.Error, match=r"invalid argument: mok::moe_forward \(CPU\): topk_ids "
                                            rf"must be an int32 CPU tensor of shape \[T, K\]; "
                                            rf"got {got}$"):
            mt.moe(x, bad, w, params, m.config, check_ids=False)
    assert torch.equal(mt.moe(x, ids, w, params, m.config), want)
