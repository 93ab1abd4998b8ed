"""Cross-check of fp4attn's codecs against ml_dtypes (an independent implementation).

tests/python/dump_codecs prints our decodes of every code, our encodes of a deterministic set of
floats and a few thousand NVFP4/MXFP4 blocks; this test recomputes them with ml_dtypes' astype
(round to nearest even) and numpy float32 arithmetic.

Where the rules differ, the difference itself is asserted:
  * ml_dtypes does not saturate E4M3/E5M2: a finite value that rounds past the largest finite
    value (|x| > 464 for E4M3, |x| >= 61440 for E5M2) becomes NaN / Inf there; we give +-448 /
    +-57344 (satfinite for finite values).
  * E2M1 NaN: ml_dtypes gives a signed zero (0.6.0: the sign is the inverse of the NaN's sign
    bit); we always give +0 (0x0), and the block scale carries the NaN.
  * UE8M0: ml_dtypes rounds the significand to nearest (1.5 itself goes up) where we offer
    floor and ceil, so its result must be our floor below 1.5 and our ceil from 1.5 on.
    ml_dtypes maps 0 to NaN (we: 0x00), overflows to NaN from 1.5 * 2^127 on (we clamp to
    2^127), and rounds float subnormals its own way (we compare normal floats only).

Run through CTest (ml_dtypes_crosscheck), which sets FP4ATTN_DUMP_CODECS to the executable.
"""

import os
import subprocess

import ml_dtypes
import numpy as np
import pytest

F4 = ml_dtypes.float4_e2m1fn
E4M3 = ml_dtypes.float8_e4m3fn
E5M2 = ml_dtypes.float8_e5m2
E8M0 = ml_dtypes.float8_e8m0fnu


@pytest.fixture(scope="module")
def dump():
    exe = os.environ.get("FP4ATTN_DUMP_CODECS")
    if not exe:
        pytest.fail("FP4ATTN_DUMP_CODECS is not set: run through ctest (ml_dtypes_crosscheck)")
    out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout
    dec, enc, nv, mx = {}, [], [], []
    for line in out.splitlines():
        tok = line.split()
        if tok[0] == "dec":
            dec.setdefault(tok[1], {})[int(tok[2], 16)] = int(tok[3], 16)
        elif tok[0] == "enc":
            enc.append([int(t, 16) for t in tok[1:]])
        elif tok[0] == "nv":
            nv.append([int(t, 16) for t in tok[1:]])
        elif tok[0] == "mx":
            mx.append([int(t, 16) for t in tok[1:]])
    enc = np.array(enc, dtype=np.uint64)
    return {
        "dec": dec,
        "x": enc[:, 0].astype(np.uint32).view(np.float32),
        "ours": enc[:, 1:].astype(np.uint8),
        "nv": nv,
        "mx": mx,
    }


def ml_encode(x, dtype):
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(dtype).view(np.uint8)


def ml_decode(codes, dtype):
    return np.asarray(codes, dtype=np.uint8).view(dtype).astype(np.float32)


def same_floats(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    both_nan = np.isnan(a) & np.isnan(b)
    return both_nan | (a.view(np.uint32) == b.view(np.uint32))


@pytest.mark.parametrize(
    "name,dtype,codes",
    [("e2m1", F4, 16), ("e4m3", E4M3, 256), ("e5m2", E5M2, 256), ("e8m0", E8M0, 256)],
)
def test_decode_every_code(dump, name, dtype, codes):
    ours = dump["dec"][name]
    assert sorted(ours) == list(range(codes))
    got = np.array([ours[c] for c in range(codes)], dtype=np.uint32).view(np.float32)
    want = ml_decode(np.arange(codes), dtype)
    assert same_floats(got, want).all(), np.nonzero(~same_floats(got, want))


def test_inputs_cover_every_kind_of_float(dump):
    x = dump["x"]
    assert len(x) > 300000
    assert np.isnan(x).any() and np.isinf(x).any()
    assert ((x != 0) & (np.abs(x) < np.finfo(np.float32).tiny)).sum() > 10000, "subnormals"


def test_e2m1_agrees_except_nan_sign(dump):
    x, ours = dump["x"], dump["ours"][:, 0]
    ml = ml_encode(x, F4)
    nan = np.isnan(x)
    assert np.array_equal(ours[~nan], ml[~nan])
    # Saturation agrees: ml_dtypes saturates E2M1 too (and Inf -> +-6).
    big = ~nan & (np.abs(x) > 6)
    assert big.sum() > 1000 and (ours[big] & 7 == 7).all()
    # NaN: ours +0; ml_dtypes a zero of either sign.
    assert nan.sum() > 100
    assert (ours[nan] == 0).all()
    assert ((ml[nan] & 7) == 0).all()


def test_e4m3_agrees_below_overflow_and_saturates_above(dump):
    x, ours = dump["x"], dump["ours"][:, 1]
    ml = ml_encode(x, E4M3)
    finite = np.isfinite(x)
    inside = ~finite | (np.abs(x) <= 464)  # 464 is the tie that rounds (to even) down to 448
    assert np.array_equal(ours[inside], ml[inside])
    over = finite & (np.abs(x) > 464)
    assert over.sum() > 1000
    sign = np.signbit(x[over]).astype(np.uint8) << 7
    assert np.array_equal(ours[over], sign | 0x7E), "we saturate to +-448"
    assert np.array_equal(ml[over], sign | 0x7F), "ml_dtypes gives NaN"


def test_e5m2_agrees_below_overflow_and_saturates_above(dump):
    x, ours = dump["x"], dump["ours"][:, 2]
    ml = ml_encode(x, E5M2)
    finite = np.isfinite(x)
    inside = ~finite | (np.abs(x) < 61440)  # 61440 is the tie that rounds (to even) up to Inf
    assert np.array_equal(ours[inside], ml[inside])
    over = finite & (np.abs(x) >= 61440)
    assert over.sum() > 1000
    sign = np.signbit(x[over]).astype(np.uint8) << 7
    assert np.array_equal(ours[over], sign | 0x7B), "we saturate to +-57344"
    assert np.array_equal(ml[over], sign | 0x7C), "ml_dtypes gives Inf"


def test_ue8m0_floor_ceil_bracket_ml_dtypes_rounding(dump):
    x, floor, ceil = dump["x"], dump["ours"][:, 3], dump["ours"][:, 4]
    ml = ml_encode(x, E8M0)
    # At and above 2^127 our ceil clamps to 2^127 (254), and so does ml_dtypes' rounding below
    # 1.5 * 2^127.
    top = (x >= 2.0**127) & (x < 1.5 * 2.0**127)
    assert top.any() and (floor[top] == 254).all() and (ceil[top] == 254).all()
    assert (ml[top] == 254).all()
    normal = np.isfinite(x) & (x >= np.finfo(np.float32).tiny) & (x < 2.0**127)
    assert normal.sum() > 100000
    x, floor, ceil, ml = x[normal], floor[normal], ceil[normal], ml[normal]
    frac = x.view(np.uint32) & 0x7FFFFF  # the significand is 1 + frac / 2^23
    pow2 = frac == 0
    assert np.array_equal(floor[pow2], ml[pow2]) and np.array_equal(ceil[pow2], ml[pow2])
    assert (ceil[~pow2].astype(int) == floor[~pow2].astype(int) + 1).all()
    half = 1 << 22  # significand 1.5
    down = frac < half
    up = frac > half
    tie = ~pow2 & (frac == half)
    assert np.array_equal(ml[down & ~pow2], floor[down & ~pow2])
    assert np.array_equal(ml[up], ceil[up])
    # A significand of exactly 1.5 rounds up in ml_dtypes: its RNE keeps only the implicit bit,
    # which is odd, so every tie goes up.
    assert tie.sum() > 100 and np.array_equal(ml[tie], ceil[tie])


def test_ue8m0_documented_differences(dump):
    x, floor, ceil = dump["x"], dump["ours"][:, 3], dump["ours"][:, 4]
    ml = ml_encode(x, E8M0)
    zero = x == 0
    assert zero.any() and (floor[zero] == 0).all() and (ml[zero] == 0xFF).all()
    neg_or_bad = ~zero & ~(x > 0) | np.isinf(x)
    assert (floor[neg_or_bad] == 0xFF).all() and (ml[neg_or_bad] == 0xFF).all()
    huge = np.isfinite(x) & (x >= 1.5 * 2.0**127)
    assert huge.any() and (ceil[huge] == 0xFE).all() and (ml[huge] == 0xFF).all()


def split_block(row, head):
    n = row[head]
    x = np.array(row[head + 1 : head + 1 + n], dtype=np.uint32).view(np.float32)
    codes = np.array(row[head + 1 + n :], dtype=np.uint8)
    assert len(codes) == n
    return x, codes


def test_mxfp4_blocks(dump):
    assert len(dump["mx"]) > 1000
    for row in dump["mx"]:
        rule, scale = row[0], row[1]
        x, codes = split_block(row, 2)
        amax = np.max(np.abs(x))
        _, e2 = np.frexp(np.float64(amax))  # amax = m * 2^e2, m in [0.5, 1)
        e = int(e2) - 1 - 2
        if rule == 1 and amax > 6 * 2.0**e:
            e += 1
        e = min(max(e, -127), 127)
        assert scale == e + 127
        scaled = np.ldexp(x.astype(np.float64), -e).astype(np.float32)  # exact
        assert np.array_equal(codes, ml_encode(scaled, F4)), (rule, x)


def e4m3_round_up(sf):
    values = ml_decode(np.arange(0x7F), E4M3)  # 0 .. 448, ascending
    return int(np.searchsorted(values, sf, side="left")) if sf <= 448 else 0x7E


def test_nvfp4_blocks(dump):
    assert len(dump["nv"]) > 1000
    f32 = np.float32
    for row in dump["nv"]:
        rule, s_enc, scale = row[0], np.uint32(row[1]).view(f32), row[2]
        x, codes = split_block(row, 3)
        amax = np.max(np.abs(x))
        sf = f32(f32(amax) / f32(6)) * s_enc  # FP32 ops, the contract's order
        want = int(ml_encode(np.array([sf], f32), E4M3)[0]) if rule == 0 else e4m3_round_up(sf)
        assert scale == want, (rule, sf)
        f = ml_decode([scale], E4M3)[0]
        if f == 0:
            assert (codes == 0).all()
            continue
        inv = f32(s_enc / f)
        assert np.array_equal(codes, ml_encode(x * inv, F4)), (rule, x)
