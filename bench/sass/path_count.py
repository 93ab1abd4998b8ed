#!/usr/bin/env python3
"""Counts the SASS instructions on one path through a kernel's main loop (decode.md 7.8).

Usage: path_count.py FILE.sass START END [--taken ADDR,...] [--not-taken ADDR,...] [--blocks]

FILE.sass is `cuobjdump -sass -fun NAME` output. The walk starts at START (hex) and follows the
code: unconditional branches are taken, conditional ones fall through unless listed in --taken;
it stops on reaching END (hex, exclusive). --blocks prints the path's basic blocks so that each
decision can be checked against the source. Prints the instruction count by opcode class.
"""
import argparse
import collections
import re
import sys

LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")


def parse(path):
    ins = []
    for line in open(path):
        m = LINE.search(line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2)))
    return ins


def opcode(text):
    t = text.split()
    if t[0].startswith("@"):
        t = t[1:]
    return t[0]


def klass(op):
    base = op.split(".")[0]
    groups = {
        "HMMA": "mma", "MOVM": "movm",
        "LDG": "ldg", "LDS": "lds", "STS": "sts", "LDC": "ldc", "ULDC": "uniform",
        "LOP3": "alu", "SHF": "alu", "PRMT": "alu", "IADD3": "alu", "ISETP": "alu", "SEL": "alu",
        "LEA": "alu", "FSEL": "alu", "FMNMX": "alu", "VIADD": "alu", "MOV": "mov",
        "IMAD": "imad", "HMUL2": "fma", "HFMA2": "fma", "FMUL": "fma", "FADD": "fma",
        "FFMA": "fma", "HADD2": "fma", "F2FP": "cvt", "F2F": "cvt", "MUFU": "mufu",
        "SHFL": "shfl", "VOTE": "vote", "BRA": "branch", "FSETP": "alu", "PLOP3": "alu",
        "CS2R": "mov", "S2R": "mov", "BSSY": "branch", "BSYNC": "branch", "NOP": "nop",
    }
    if base.startswith("U"):
        return "uniform"
    return groups.get(base, "other:" + base)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sass")
    ap.add_argument("start")
    ap.add_argument("end")
    ap.add_argument("--taken", default="")
    ap.add_argument("--blocks", action="store_true")
    ap.add_argument("--full", action="store_true", help="also count full opcodes (modifiers)")
    ap.add_argument("--auto", action="store_true",
                    help="decode kernel's fast path: also take a conditional branch when it skips "
                         "an integer division (I2F.RP: page_size not a power of two), the O rescale "
                         "(>= 16 FMUL), or the zeroing of a partial tile (>= 8 CS2R, no load)")
    a = ap.parse_args()
    ins = parse(a.sass)
    index = {addr: i for i, (addr, _) in enumerate(ins)}
    taken = {int(x, 16) for x in a.taken.split(",") if x}
    start, end = int(a.start, 16), int(a.end, 16)
    if a.auto:
        for k, (addr, text) in enumerate(ins):
            if not (text.startswith("@") and opcode(text) == "BRA"):
                continue
            fall = []
            for _, t in ins[k + 1:]:
                fall.append(t)
                if opcode(t) == "BRA":
                    break
            ops_fall = [opcode(t) for t in fall]
            if ("I2F.RP" in ops_fall or ops_fall.count("FMUL") >= 16 or
                    (ops_fall.count("CS2R") >= 8 and not any(o.startswith("LDG") for o in ops_fall))):
                taken.add(addr)
    i = index[start]
    counts = collections.Counter()
    ops = collections.Counter()
    total = 0
    block_start, block_n = ins[i][0], 0
    steps = 0
    while True:
        addr, text = ins[i]
        if addr == end:
            break
        steps += 1
        if steps > 100000:
            sys.exit("no end")
        op = opcode(text)
        if op != "NOP":
            total += 1
            block_n += 1
            counts[klass(op)] += 1
            ops[op if a.full else op.split(".")[0]] += 1
        nxt = i + 1
        if op == "BRA":
            target = int(text.split()[-1], 16)
            cond = text.startswith("@")
            if not cond or addr in taken:
                nxt = index[target]
            if a.blocks:
                print(f"  block {block_start:05x}-{addr:05x}: {block_n:4d} -> "
                      f"{'taken' if nxt != i + 1 else 'fall'} ({text})")
            block_start, block_n = ins[nxt][0], 0
        elif op == "EXIT":
            sys.exit("EXIT reached")
        i = nxt
    print(f"total {total}")
    print("  " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda x: -x[1])))
    print("  " + ", ".join(f"{k} {v}" for k, v in sorted(ops.items(), key=lambda x: -x[1])))


if __name__ == "__main__":
    main()
