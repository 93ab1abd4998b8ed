#!/usr/bin/env python3
"""Turns the side-by-side forward run on the H200 (side_by_side.json: fp4attn's recipes beside
torch SDPA cuDNN BF16, FlashAttention-3 BF16/FP8 and SageAttention2, one row per point) into the
fwd-peers record, bench/results/fwd-peers.json, in the schema of docs/design.md ("Records").

    python3 bench/side_by_side_record.py side_by_side.json --out bench/results/fwd-peers.json \
        --revision REV --command "the command that produced side_by_side.json" [--date ISO]

One record per (system, recipe, path, point): system "fp4attn" (recipe: its recipe), "fa3-fp8",
"fa3-bf16", "sage2" or "sdpa-cudnn-bf16" (recipe null); path "kernel" (operands quantized
beforehand) or "e2e" (BF16 in, quantization included; the BF16 systems have only this one);
tflops, ms, speedup (cuDNN time / this time, the same point) and cos / rel_l2 where measured.
A measurement that failed goes to "errors". A row key the converter does not know is refused.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record  # bench/record.py: the record's head, the JSON file

SUITE = "fwd-peers"
CUDNN = "sdpa-cudnn-bf16"
# Row-key stem -> (system, path); any other "<recipe>_k" / "<recipe>_e2e" is an fp4attn recipe.
PEER_STEMS = {
    "cudnn_bf16": (CUDNN, "e2e"),
    "fa3_bf16": ("fa3-bf16", "e2e"),
    "fa3_fp8_k": ("fa3-fp8", "kernel"),
    "fa3_fp8_e2e": ("fa3-fp8", "e2e"),
    "sage2_k": ("sage2", "kernel"),
    "sage2_e2e": ("sage2", "e2e"),
}
RECIPE_STEM = re.compile(r"^(?P<recipe>[a-z0-9][a-z0-9-]*)_(?P<path>k|e2e)$")
SUFFIXES = ("_x", "_cos", "_rl2", "_err")
SHAPE_KEYS = ("d", "s", "b", "h", "hkv", "causal")
TOP_KEYS = {"gpu", "torch", "rows", "wall_s"}
TIMING = "triton do_bench median, warmup 25 ms, rep 120 ms"
PATHS = (
    "kernel: operands quantized beforehand (FA3 FP8 on E4M3 cast once; SageAttention2's sm90 "
    "kernel on its own INT8 Q/K and FP8 V; fp4attn's attn_quantized on quantize_qkv's "
    "operands); e2e: BF16 in, quantization included (FA3 FP8 after a plain cast, "
    "SageAttention2's sageattn_qk_int8_pv_fp8_cuda_sm90, fp4attn's attn_func); the BF16 "
    "systems (sdpa-cudnn-bf16, fa3-bf16) take BF16 as is: one record each, path e2e"
)


def split_key(key: str) -> tuple[str, str]:
    """A row key as (stem, suffix): "sage2_k_x" -> ("sage2_k", "_x"), "fp8_k" -> ("fp8_k", "")."""
    for suffix in SUFFIXES:
        if key.endswith(suffix) and (
            key[: -len(suffix)] in PEER_STEMS or RECIPE_STEM.match(key[: -len(suffix)])
        ):
            return key[: -len(suffix)], suffix
    return key, ""


def stem_system(stem: str) -> tuple[str, str | None, str]:
    """(system, recipe, path) of a measurement's stem; ValueError for a stem of no system."""
    if stem in PEER_STEMS:
        system, path = PEER_STEMS[stem]
        return system, None, path
    m = RECIPE_STEM.match(stem)
    if m is None:
        raise ValueError(
            f"row key {stem!r}: expected a shape key {SHAPE_KEYS}, a peer "
            f"({', '.join(PEER_STEMS)}) or '<recipe>_k' / '<recipe>_e2e', each "
            f"with an optional {'/'.join(SUFFIXES)} suffix"
        )
    return "fp4attn", m["recipe"], "kernel" if m["path"] == "k" else "e2e"


def number(row: dict, key: str, where: str) -> float:
    value = row[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{where}: {key} must be a number, got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{where}: {key} must be a positive finite number, got {value!r}")
    return float(value)


def row_shape(row: Any, index: int) -> dict:
    if not isinstance(row, dict):
        raise TypeError(f"rows[{index}] must be an object, got {type(row).__name__}")
    missing = [k for k in SHAPE_KEYS + ("cudnn_bf16",) if k not in row]
    if missing:
        raise ValueError(f"rows[{index}] lacks {', '.join(missing)}")
    shape = {}
    for key in ("d", "s", "b", "h", "hkv"):
        value = row[key]
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"rows[{index}].{key} must be a positive integer, got {value!r}")
        shape[key] = value
    if not isinstance(row["causal"], bool):
        raise TypeError(f"rows[{index}].causal must be true or false, got {row['causal']!r}")
    shape["causal"] = row["causal"]
    return shape


def point_flops(shape: dict) -> float:
    """4 b h s² d, halved for causal (the convention of every forward record here)."""
    flops = 4 * shape["b"] * shape["h"] * shape["s"] ** 2 * shape["d"]
    return flops / 2 if shape["causal"] else flops


def convert_row(row: Any, index: int) -> tuple[list[dict], list[dict]]:
    """The records and errors of one side-by-side row."""
    shape = row_shape(row, index)
    where = f"rows[{index}] (d={shape['d']}, s={shape['s']}, causal={shape['causal']})"
    stems: dict[str, dict[str, Any]] = {}
    for key in row:
        if key in SHAPE_KEYS:
            continue
        stem, suffix = split_key(key)
        stem_system(stem)  # refuses a key of no system
        stems.setdefault(stem, {})[suffix] = key
    flops = point_flops(shape)
    cudnn_tflops = number(row, "cudnn_bf16", where)
    point = {
        "b": shape["b"],
        "h": shape["h"],
        "h_kv": shape["hkv"],
        "s_q": shape["s"],
        "s_k": shape["s"],
        "d": shape["d"],
        "causal": shape["causal"],
    }
    records, errors = [], []
    for stem, keys in stems.items():
        system, recipe, path = stem_system(stem)
        head = {"system": system, "recipe": recipe, "path": path}
        if "_err" in keys:
            message = row[keys["_err"]]
            if not isinstance(message, str):
                raise TypeError(f"{where}: {keys['_err']} must be a string")
            errors.append({**head, **point, "error": message})
        if "" not in keys:
            stray = [k for s, k in keys.items() if s != "_err"]
            if stray:
                raise ValueError(f"{where}: {', '.join(stray)} without {stem}")
            continue
        tflops = number(row, stem, where)
        rec = {**head, **point, "tflops": tflops, "ms": flops / tflops / 1e9}
        # _x is cuDNN time / this time as the run rounded it; the TFLOP/s ratio is the same.
        rec["speedup"] = (
            1.0
            if system == CUDNN
            else number(row, keys["_x"], where)
            if "_x" in keys
            else tflops / cudnn_tflops
        )
        if ("_cos" in keys) != ("_rl2" in keys):
            raise ValueError(f"{where}: {stem} has one of _cos/_rl2 without the other")
        for suffix, field in (("_cos", "cos"), ("_rl2", "rel_l2")):
            if suffix in keys:
                value = row[keys[suffix]]
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise TypeError(f"{where}: {keys[suffix]} must be a number, got {value!r}")
                rec[field] = float(value)
        records.append(rec)
    return records, errors


def grid_config(rows: list[dict]) -> dict:
    """tokens / hidden when every row has the same (the FA grid: b·s = 16384, h·d = 2048)."""
    tokens = {r["b"] * r["s"] for r in rows}
    hidden = {r["h"] * r["d"] for r in rows}
    config = {}
    if len(tokens) == 1:
        config["tokens"] = tokens.pop()
    if len(hidden) == 1:
        config["hidden"] = hidden.pop()
    return config


def convert(side_by_side: Any, revision: str, command: str, date: str | None = None) -> dict:
    """The fwd-peers record of a parsed side_by_side.json."""
    if not isinstance(side_by_side, dict):
        raise TypeError(f"side_by_side must be an object, got {type(side_by_side).__name__}")
    unknown = sorted(set(side_by_side) - TOP_KEYS)
    if unknown:
        raise ValueError(f"side_by_side: unknown keys {unknown} (expected {sorted(TOP_KEYS)})")
    rows = side_by_side.get("rows")
    if not isinstance(rows, list) or not rows:
        raise ValueError("side_by_side.rows must be a non-empty list of points")
    for name, value in (("revision", revision), ("command", command)):
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{name} must be a non-empty string")
    records, errors = [], []
    for i, row in enumerate(rows):
        recs, errs = convert_row(row, i)
        records += recs
        errors += errs
    doc = record.header(SUITE, revision, side_by_side.get("gpu", "unknown"), command, date)
    doc["software"] = {"torch": side_by_side.get("torch")}
    doc["wall_s"] = side_by_side.get("wall_s")
    doc["config"] = {
        **grid_config(rows),
        "timing": TIMING,
        "flops": "4 b h s_q s_k d, halved for causal; tflops = flops / median time",
        "speedup": "sdpa-cudnn-bf16 time / this time, the same point and run",
        "paths": PATHS,
        "accuracy": "cos and rel_l2 of O against float64 SDPA, where measured",
        "ms": "derived: flops / tflops (the run records TFLOP/s)",
    }
    doc["records"] = records
    doc["errors"] = errors
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("side_by_side", help="the side-by-side run's JSON")
    ap.add_argument(
        "--out", required=True, help="the record to write (bench/results/fwd-peers.json)"
    )
    ap.add_argument("--revision", required=True, help="the fp4attn revision measured")
    ap.add_argument("--command", required=True, help="the command that produced the input")
    ap.add_argument("--date", default=None, help="UTC date of the run (default: now)")
    args = ap.parse_args(argv)
    try:
        with open(args.side_by_side) as f:
            raw = json.load(f)
        doc = convert(raw, args.revision, args.command, args.date)
    except (OSError, json.JSONDecodeError, TypeError, ValueError) as e:
        print(f"side_by_side_record.py: {args.side_by_side}: {e}", file=sys.stderr)
        return 1
    record.write_json(doc, args.out, digits=6)
    print(f"wrote {args.out}: {len(doc['records'])} records, {len(doc['errors'])} errors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
