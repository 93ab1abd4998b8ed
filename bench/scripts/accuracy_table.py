"""Turns the raw JSON of bench/scripts/accuracy-table into the accuracy record and its tables.

    accuracy_table.py RAW_DIR [--command C] [--record JSON] [--md MD] [--doc numerics.md]

Writes the record (every figure, with revision, date and command) and a Markdown page, replaces
the generated tables between the accuracy markers of the doc, and prints the Markdown.
"""

import argparse
import json
import os
import pathlib
import sys
import textwrap

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import record  # bench/record.py: revision, date, the JSON file

RUNS = ["noncausal", "causal", "causal-sq-gt-sk", "outliers-smooth-k"]
EMULATION_RUNS = ["emulation-noncausal", "emulation-causal"]
MARKERS = {"accuracy": ("<!-- accuracy-table:begin -->", "<!-- accuracy-table:end -->"),
           "blackwell": ("<!-- blackwell-table:begin -->", "<!-- blackwell-table:end -->")}


def column_title(run, rec):
    if run == "causal-sq-gt-sk":
        return f"{rec['input']}, causal s_q={rec['s_q']} > s_k={rec['s_k']}"
    if run == "outliers-smooth-k":
        return f"{rec['input']}, smooth_k"
    return rec["input"] + (", causal" if run == "causal" else "")


def accuracy_table(runs):
    columns = []  # (title, {recipe: record})
    for run in RUNS:
        records = runs[run]["records"]
        for inp in dict.fromkeys(r["input"] for r in records):
            group = {r["recipe"]: r for r in records if r["input"] == inp}
            columns.append((column_title(run, next(iter(group.values()))), group))
    lines = ["| recipe | " + " | ".join(t for t, _ in columns) + " |",
             "|---" * (len(columns) + 1) + "|"]
    for recipe in columns[0][1]:
        cells = [f"{c[recipe]['cos']:.4f} / {c[recipe]['rel_l2']:.3f} / {c[recipe]['max_abs']:.3g}"
                 for _, c in columns]
        lines.append(f"| `{recipe}` | " + " | ".join(cells) + " |")
    return lines


def emulation_table(runs, inputs):
    """Per FP4 recipe: folded-vs-exact rel-L2 and each against float64, non-causal and causal."""
    head = ["recipe"]
    for causal in ("", ", causal"):
        head += [f"folded vs exact{causal}", f"folded vs f64{causal}", f"exact vs f64{causal}"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    recs = {(r["recipe"], r["input"], r["causal"]): r
            for run in EMULATION_RUNS for r in runs[run]["records"]}
    recipes = list(dict.fromkeys(r[0] for r in recs))
    for inp in inputs:
        for recipe in recipes:
            cells = []
            for causal in (False, True):
                r = recs[(recipe, inp, causal)]
                fx, ff, xf = r["folded_vs_exact"], r["folded_vs_f64"], r["exact_vs_f64"]
                same = fx["rel_l2"] == 0 and fx["max_abs"] == 0
                cells += ["0 (identical)" if same else f"{fx['rel_l2']:.4f} (max {fx['max_abs']:.2g})",
                          f"{ff['cos']:.4f} / {ff['rel_l2']:.4f}",
                          f"{xf['cos']:.4f} / {xf['rel_l2']:.4f}"]
            name = f"`{recipe}`" + ("" if len(inputs) == 1 else f", {inp}")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def replace_between(text, key, body):
    begin, end = MARKERS[key]
    i, j = text.find(begin), text.find(end)
    if i < 0 or j < i:
        raise SystemExit(f"accuracy_table.py: markers {begin} ... {end} not found in the doc")
    return text[:i + len(begin)] + "\n" + body + "\n" + text[j:]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("raw")
    ap.add_argument("--command", default="bench/scripts/accuracy-table")
    ap.add_argument("--binary", default="build/fp4attn")
    ap.add_argument("--record")
    ap.add_argument("--md")
    ap.add_argument("--doc")
    args = ap.parse_args()
    raw = pathlib.Path(args.raw)
    runs = {name: json.loads((raw / f"{name}.json").read_text())
            for name in RUNS + EMULATION_RUNS}
    # "-dirty" only when what the figures depend on (library, headers, CLI, build) has local edits.
    rev = record.git_revision(dirty_paths=("src", "include", "tools", "CMakeLists.txt"))
    date = record.utc_now()
    first = runs["noncausal"]["records"][0]
    problem = {k: first[k] for k in ("b", "h", "d", "s_q")}
    doc = {"suite": "accuracy", "revision": rev, "date": date, "command": args.command,
           "binary": args.binary, "backend": "cpu-golden",
           "reference": "float64 attention of the same inputs", "problem": problem, "seed": 0,
           "runs": [{"name": n, **runs[n]} for n in RUNS + EMULATION_RUNS]}

    provenance = (f"Revision `{rev}`, {date[:10]}, produced by `{args.command.strip()}` "
                  f"(record: [bench/results/accuracy.json](../bench/results/accuracy.json)).")
    acc = accuracy_table(runs)
    acc_intro = textwrap.fill(
        "`cos / rel-L2 / max-abs` of O against float64 attention of the same (BF16-exact) inputs; "
        f"b={problem['b']}, h={problem['h']}, s={problem['s_q']}, d={problem['d']}, seed 0, the "
        "golden model with the Hopper (folded) operands. " + provenance, 100,
        break_long_words=False, break_on_hyphens=False)
    emu = emulation_table(runs, ["gaussian"])
    emu_intro = textwrap.fill(
        "Golden model, Gaussian suite input, b=1, h=4, s=1024, d=128, seed 0. `folded vs exact`: "
        "rel-L2 (and max-abs) between the outputs of Emulation::kFoldedE4M3 (Hopper) and "
        "Emulation::kBlockScaledExact (Blackwell products); the other columns `cos / rel-L2` "
        "against float64. " + provenance, 100, break_long_words=False, break_on_hyphens=False)
    all_inputs = list(dict.fromkeys(r["input"] for r in runs["emulation-noncausal"]["records"]))

    md = ["# Accuracy of the recipes (golden model vs float64)", "",
          f"Revision `{rev}`, {date}, `{args.command.strip()}`; every figure is in "
          "[accuracy.json](accuracy.json).", "",
          # The page sits beside the record, the doc two levels up.
          "## Every recipe on the pinned suite", "",
          acc_intro.replace("(../bench/results/accuracy.json)", "(accuracy.json)"), "", *acc, "",
          "## Hopper folding vs Blackwell block-scaled products (every input)", "",
          *emulation_table(runs, all_inputs), ""]
    if args.record:
        record.write_json(doc, args.record)
    if args.md:
        pathlib.Path(args.md).write_text("\n".join(md))
    if args.doc:
        doc = pathlib.Path(args.doc)
        text = replace_between(doc.read_text(), "accuracy", "\n".join([acc_intro, "", *acc]))
        text = replace_between(text, "blackwell", "\n".join([emu_intro, "", *emu]))
        doc.write_text(text)
    print("\n".join(md))


if __name__ == "__main__":
    main()
