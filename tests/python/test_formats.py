"""Codecs bit for bit against ml_dtypes; quantizers bit for bit against numpy_formats.py."""
import ml_dtypes
import numpy as np
import pytest

import mok
import numpy_formats as ref

N = 1 << 20  # values per codec and per quantizer


def special_values():
    f = np.finfo(np.float32)
    v = [0.0, -0.0, np.nan, -np.nan, np.inf, -np.inf, f.max, -f.max, f.tiny, f.smallest_subnormal,
         -f.smallest_subnormal, 448, 464, 464.00003, 480, 500, 57344, 61440, 61441, 6, 6.5, 7, 1e30,
         2.0 ** -9, 2.0 ** -10, 2.0 ** -16, 2.0 ** -17, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -0.1]
    v = np.array(v, dtype=np.float32)
    return np.concatenate([v, -v, np.nextafter(v, np.float32(np.inf)), np.nextafter(v, np.float32(-np.inf))])


def random_values(rng, n):
    """Random FP32 bit patterns of every exponent, finite and not, plus the special values."""
    bits = rng.integers(0, 1 << 32, size=n, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    small = (rng.standard_normal(n // 2) * 2.0 ** rng.integers(-20, 20, n // 2)).astype(np.float32)
    return np.concatenate([x[: n - n // 2 - len(special_values())], small, special_values()])


def test_e4m3_every_code_point_and_random_values(rng):
    codes = np.arange(256, dtype=np.uint8)
    ours, theirs = mok.decode_e4m3(codes), codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    assert np.array_equal(ours, theirs, equal_nan=True)
    x = random_values(rng, N)
    assert len(x) == N
    got = mok.encode_e4m3(x)
    assert np.array_equal(got, ref.e4m3(x))
    assert (got[np.isnan(x)] == 0x7F).all()


def test_e5m2_every_code_point_and_random_values(rng):
    codes = np.arange(256, dtype=np.uint8)
    assert np.array_equal(mok.decode_e5m2(codes), codes.view(ml_dtypes.float8_e5m2).astype(np.float32), equal_nan=True)
    x = random_values(rng, N)
    got = mok.encode_e5m2(x)
    finite = np.isfinite(x)
    want = np.clip(x[finite], -57344, 57344).astype(ml_dtypes.float8_e5m2).view(np.uint8)
    assert np.array_equal(got[finite], want)
    assert (got[np.isnan(x)] == 0x7F).all()
    assert (got[x == np.inf] == 0x7C).all() and (got[x == -np.inf] == 0xFC).all()


def test_e2m1_every_code_point_and_random_values(rng):
    codes = np.arange(16, dtype=np.uint8)
    assert np.array_equal(mok.decode_e2m1(codes), codes.view(ml_dtypes.float4_e2m1fn).astype(np.float32))
    x = random_values(rng, N)
    got = mok.encode_e2m1(x)
    assert np.array_equal(got, ref.e2m1(x))
    assert (got[x == np.inf] == 0x7).all() and (got[x == -np.inf] == 0xF).all()
    assert mok.encode_e2m1(np.array([-0.1], np.float32))[0] == 0x8


def test_e8m0_every_code_point():
    codes = np.arange(256, dtype=np.uint8)
    assert np.array_equal(mok.decode_e8m0(codes), codes.view(ml_dtypes.float8_e8m0fnu).astype(np.float32), equal_nan=True)


def test_bf16_random_values(rng):
    x = random_values(rng, N)
    got = mok.encode_bf16(x)
    want = x.astype(ml_dtypes.bfloat16).view(np.uint16)
    nan = np.isnan(x)
    assert np.array_equal(got[~nan], want[~nan])
    assert np.isnan(got[nan].view(ml_dtypes.bfloat16).astype(np.float32)).all()


def block_matrix(rng, rows, cols, br, bc):
    """~1M values in blocks of very different scales, with zero, subnormal, huge and non-finite
    blocks and elements."""
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    scales = np.ldexp(np.float32(1), rng.integers(-140, 120, size=(rows // br, cols // bc)))
    x *= np.repeat(np.repeat(scales, br, 0), bc, 1).astype(np.float32)
    x = x.astype(np.float32)
    x[:br, :bc] = 0
    x[:br, bc:2 * bc] = -0.0
    flat = x.reshape(-1)
    idx = rng.choice(flat.size, 64, replace=False)
    flat[idx[:16]] = np.nan
    flat[idx[16:32]] = np.inf
    flat[idx[32:40]] = -np.inf
    flat[idx[40:48]] = np.finfo(np.float32).max
    flat[idx[48:56]] = np.finfo(np.float32).smallest_subnormal
    flat[idx[56:64]] = 448.0
    return x


@pytest.mark.parametrize("block", [(1, 32), (32, 1)])
@pytest.mark.parametrize("rule", ["rceil", "floor"])
def test_mxfp8_bitwise(rng, block, rule):
    x = block_matrix(rng, 1024, 1024, *block)
    data, scales = mok.quantize_mxfp8(x, block, rule)
    want_data, want_scales = ref.mxfp8(x, block, rule)
    assert np.array_equal(scales, want_scales)
    assert np.array_equal(data, want_data)
    d = mok.dequantize_mxfp8(data, scales, block)
    ok = np.repeat(np.repeat(scales != 0xFF, block[0], 0), block[1], 1)
    expect = ref.e4m3_value(data) * np.ldexp(np.float32(1), scales.astype(np.int32) - 127).repeat(block[0], 0).repeat(block[1], 1)
    assert np.array_equal(d[ok], expect[ok].astype(np.float32))
    assert np.isnan(d[~ok]).all()


@pytest.mark.parametrize("block", [(1, 16), (16, 16)])
def test_nvfp4_bitwise(rng, block):
    for scale_exp in (0, -30, 40):  # the global scale in and out of the usual range
        x = rng.standard_normal((1024, 1024)).astype(np.float32) * np.float32(2.0 ** scale_exp)
        x *= np.ldexp(np.float32(1), rng.integers(-6, 6, size=(1024, 1))).astype(np.float32)
        x[5, 7] = np.nan
        x[9, 100:116] = 0
        x[13, 3] = -np.inf
        data, scales, gamax, s_dec = mok.quantize_nvfp4(x, block)
        want_data, want_scales, want_gamax, want_s_dec = ref.nvfp4(x, block)
        assert gamax == want_gamax and s_dec == want_s_dec
        assert np.array_equal(scales, want_scales)
        assert np.array_equal(data, want_data)


def test_nvfp4_all_zero_tensor():
    data, scales, gamax, s_dec = mok.quantize_nvfp4(np.zeros((16, 32), np.float32))
    assert gamax == 0 and s_dec == 1 and not data.any() and not scales.any()


@pytest.mark.parametrize("block", [(1, 128), (128, 1), (128, 128)])
@pytest.mark.parametrize("ue8m0", [False, True])
def test_fp8_block_bitwise(rng, block, ue8m0):
    x = block_matrix(rng, 1024, 1024, *block)
    data, scales = mok.quantize_fp8_block(x, block, ue8m0)
    want_data, want_scales = ref.fp8_block(x, block, ue8m0)
    assert np.array_equal(scales, want_scales, equal_nan=True)
    assert np.array_equal(data, want_data)


def test_nvfp4_many_global_scales(rng):
    """The per-tensor scale enters every block scale: many small tensors, each its own amax."""
    for _ in range(3000):
        x = (rng.standard_normal((2, 32)) * np.exp(rng.uniform(-20, 20))).astype(np.float32)
        got = mok.quantize_nvfp4(x)
        want = ref.nvfp4(x)
        assert got[2] == want[2] and got[3] == want[3]
        assert np.array_equal(got[1], want[1]) and np.array_equal(got[0], want[0])


def test_dequantizers_refuse_scales_of_the_wrong_shape():
    """Issue 33's finding: dequantize_mxfp8 with one scale for a 2048 x 2048 tensor read past it."""
    d = np.zeros((2048, 2048), np.uint8)
    with pytest.raises(mok.Error, match=r"scales must be .* = \[2048, 64\]; got shape \[1\]"):
        mok.dequantize_mxfp8(d, np.zeros(1, np.uint8))
    with pytest.raises(mok.Error, match=r"= \[2048, 64\]; got shape \[64, 2048\]"):
        mok.dequantize_mxfp8(d, np.zeros((64, 2048), np.uint8))
    with pytest.raises(mok.Error, match=r"scales must be .* = \[128, 256\]"):
        mok.dequantize_nvfp4(d, np.zeros((2048, 128), np.uint8), 1.0, block=(16, 16))
    with pytest.raises(mok.Error, match=r"scales must be .* = \[16, 16\]"):
        mok.dequantize_fp8_block(d, np.zeros((2048, 16), np.float32), block=(128, 128))
    with pytest.raises(mok.Error, match="block 1x0 must be positive"):
        mok.dequantize_mxfp8(d, np.zeros((2048, 64), np.uint8), block=(1, 0))
    with pytest.raises(mok.Error, match="block 2x16 is not allowed"):
        mok.dequantize_nvfp4(d, np.zeros((1024, 256), np.uint8), 1.0, block=(2, 16))
