"""An independent NumPy implementation of formats.md's block rules, for bit-for-bit comparison.

Element rounding comes from ml_dtypes; scales are derived with frexp (exact), not with the bit
procedures the C++ code uses.
"""
import ml_dtypes
import numpy as np

F32 = np.float32
FLT_MAX = np.finfo(np.float32).max


def e4m3(x):
    """E4M3 codes, saturating, NaN as 0x7F."""
    x = np.asarray(x, dtype=F32)
    with np.errstate(invalid="ignore"):
        q = np.clip(x, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    return np.where(np.isnan(x), np.uint8(0x7F), q)


def e2m1(x):
    x = np.asarray(x, dtype=F32)
    q = np.clip(x, -6, 6).astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF
    return np.where(np.isnan(x), np.uint8(0), q).astype(np.uint8)


def e4m3_value(c):
    return np.asarray(c, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(F32)


def ceil_log2(v):
    """ceil(log2(v)) for positive float32 v, exactly (frexp is exact)."""
    m, e = np.frexp(v.astype(np.float64))
    return np.where(m == 0.5, e - 1, e)


def blocks(x, br, bc):
    """View [R, C] as [R/br, C/bc, br*bc] blocks (shapes divisible by the block)."""
    r, c = x.shape
    return x.reshape(r // br, br, c // bc, bc).transpose(0, 2, 1, 3).reshape(r // br, c // bc, br * bc)


def unblocks(b, br, bc):
    nr, nc, _ = b.shape
    return b.reshape(nr, nc, br, bc).transpose(0, 2, 1, 3).reshape(nr * br, nc * bc)


def finite_amax(b):
    return np.where(np.isfinite(b), np.abs(b), F32(0)).max(axis=-1).astype(F32)


def mxfp8(x, block=(1, 32), rule="rceil"):
    b = blocks(x, *block)
    amax = finite_amax(b)
    bad = ~np.isfinite(b).all(axis=-1)
    if rule == "rceil":
        v = amax * F32(1.0 / 448.0)
        with np.errstate(divide="ignore"):
            e = np.where(v == 0, -127, ceil_log2(np.where(v == 0, F32(1), v)))
    else:
        _, fe = np.frexp(np.where(amax == 0, 1.0, amax.astype(np.float64)))
        e = np.where(amax == 0, -127, (fe - 1) - 8)
    scale = np.clip(e + 127, 0, 254).astype(np.uint8)
    factor = np.ldexp(F32(1), (127 - scale.astype(np.int32)))[..., None].astype(F32)
    q = e4m3(b * factor)
    q = np.where(np.isfinite(b), q, np.uint8(0x7F))
    return unblocks(q, *block), np.where(bad, np.uint8(0xFF), scale)


def nvfp4(x, block=(1, 16)):
    gamax = np.where(np.isfinite(x), np.abs(x), F32(0)).max().astype(F32)
    if gamax == 0:
        s_enc = F32(1)
    else:
        with np.errstate(divide="ignore", over="ignore"):
            s_enc = F32(2688.0) / gamax
        s_enc = min(s_enc, FLT_MAX)
    s_dec = F32(1) / F32(s_enc)
    b = blocks(x, *block)
    amax = finite_amax(b)
    bad = ~np.isfinite(b).all(axis=-1)
    t = F32(s_enc) * F32(1.0 / 6.0)
    scale = e4m3(amax * t) & 0x7F
    with np.errstate(divide="ignore", over="ignore"):
        enc = F32(1) / (e4m3_value(scale) * s_dec)
    enc = np.minimum(enc, FLT_MAX).astype(F32)
    with np.errstate(over="ignore", invalid="ignore"):
        q = e2m1(np.clip(b * enc[..., None], -6, 6))
    q = np.where(np.isfinite(b), q, np.uint8(0))
    q = unblocks(q, *block)
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)
    return packed, np.where(bad, np.uint8(0x7F), scale).astype(np.uint8), gamax, s_dec


def fp8_block(x, block=(1, 128), ue8m0=False):
    b = blocks(x, *block)
    a = np.maximum(finite_amax(b), F32(1e-4)).astype(F32)
    bad = ~np.isfinite(b).all(axis=-1)
    if ue8m0:
        e = np.clip(ceil_log2(a * F32(1.0 / 448.0)), -127, 127)
        enc = np.ldexp(F32(1), -e).astype(F32)
        s = np.ldexp(F32(1), e).astype(F32)
    else:
        enc = (F32(448.0) / a).astype(F32)
        s = (a / F32(448.0)).astype(F32)
    with np.errstate(over="ignore", invalid="ignore"):
        q = e4m3(b * enc[..., None])
    q = np.where(np.isfinite(b), q, np.uint8(0x7F))
    return unblocks(q, *block), np.where(bad, F32(np.nan), s)
