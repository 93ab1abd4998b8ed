#!/usr/bin/env python3
"""Writes the committed seed corpus of the fuzz targets (tests/fuzz/corpus/<target>/): a few
small inputs per target in each target's input format (see the top of tests/fuzz/fuzz_*.cc).
Rerun after changing a format: python3 tests/fuzz/corpus/make_seeds.py"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def f32(*xs):
    return b"".join(struct.pack("<f", x) for x in xs)


def write(target, name, data):
    os.makedirs(os.path.join(HERE, target), exist_ok=True)
    with open(os.path.join(HERE, target, name), "wb") as f:
        f.write(data)


inf, nan = float("inf"), float("nan")
flt_max = struct.unpack("<f", b"\xff\xff\x7f\x7f")[0]

# Codecs: every byte code once; floats at ties, saturation edges, specials and subnormals.
write("fuzz_codecs", "all_codes", bytes(range(256)))
write("fuzz_codecs", "ties", f32(0.25, 0.75, 1.25, 2.5, 3.5, 5.0, 7.0, 464.0, 61440.0))
write("fuzz_codecs", "edges", f32(6.0, -6.0, 448.0, 57344.0, flt_max, -flt_max, 2.0**-9, 2.0**-17))
write("fuzz_codecs", "specials", f32(0.0, -0.0, inf, -inf, nan, 1e-45, 2.0**-127, 2.0**127))

# Quantizers: [kind][n][mode][s_enc][exponent] + values; kinds 0-3 NVFP4 rules, 4-5 MXFP4,
# 6-7 FP8 E4M3/E5M2. mode bit 0: raw FP32 values, bit 1: the fuzzed s_enc.
ramp = b"".join(struct.pack("<h", v) for v in (-1200, 37, 900, -3, 4095, 0, 12, -800) * 4)
for kind in range(8):
    header = bytes([kind, 31, 0]) + f32(0.0) + bytes([250])
    write("fuzz_quantize", f"kind{kind}_ramp", header + ramp)
write("fuzz_quantize", "nvfp4_nan", bytes([0, 15, 1]) + f32(0.0) + b"\0" + f32(1.0, nan, 3.0))
write("fuzz_quantize", "mx_inf", bytes([5, 31, 1]) + f32(0.0) + b"\0" + f32(2.0, -inf))
write("fuzz_quantize", "static_scale", bytes([2, 15, 3]) + f32(5.0) + b"\0" + f32(1.0, -7.5, 0.01))
write("fuzz_quantize", "near_flt_max", bytes([5, 3, 1]) + f32(0.0) + b"\0" + f32(-3.1e38, 1.0))
write("fuzz_quantize", "tiny", bytes([6, 7, 1]) + f32(0.0) + b"\0" + f32(1e-40, -3e-39, 1e-45))

# Scale layout: [rows: 2][sf_cols][probe: 7] + bytes; shapes at and across atom borders.
for rows, cols in ((1, 1), (127, 4), (128, 4), (129, 5), (639, 39)):
    write("fuzz_scale_layout", f"r{rows}_c{cols}",
          struct.pack("<H", rows - 1) + bytes([cols - 1]) + bytes(range(7, 14)) + bytes(range(32)))

# CLI parser: [lo: 8][hi: 8] + NUL-separated words.
def argv(lo, hi, *words):
    return struct.pack("<qq", lo, hi) + b"\0".join(w.encode() for w in words)

write("fuzz_cli_args", "values", argv(1, 4096, "--heads", "32", "--quick", "--ms=2.5"))
write("fuzz_cli_args", "lists", argv(1, 4096, "--recipes=fp8,nvfp4", "--dims", "64,128"))
write("fuzz_cli_args", "help", argv(0, 1, "-h", "--out", "a b's.json"))
write("fuzz_cli_args", "bad", argv(0, 2**63 - 1, "--bogus", "--dims", "64,,x", "--quick=1"))
write("fuzz_cli_args", "range", argv(10, -10, "--batch", "-9223372036854775808", "--seqlen-q"))

# Golden forward: [flags][s_q][s_k][recipe][poison kind, batch, token, head, channel][scale] +
# values. flags: bit 0 b=2, 1 h_kv=2, 2 GQA, 3 causal, 4 d=128, 5 exact, 6 wide, 7 default scale.
seeds = [
    (0x80, 8, 8, 2, 0), (0x88, 8, 3, 0, 0), (0x8F, 5, 7, 1, 1), (0x84, 4, 8, 6, 3),
    (0x98, 2, 6, 7, 2), (0xA8, 6, 6, 4, 5), (0x89, 7, 2, 5, 6), (0xC0, 3, 5, 3, 0),
    (0x88, 8, 0, 2, 0), (0x8A, 4, 8, 7, 3), (0x80, 1, 8, 0, 6), (0x8C, 8, 8, 4, 2),
]
for i, (flags, s_q, s_k, recipe, poison) in enumerate(seeds):
    write("fuzz_golden", f"seed{i:02d}", bytes([flags, s_q, s_k, recipe, poison, 0, 1, 0, 5, 0]))
