"""Renders the JSON written by scripts/accuracy-table as the Markdown table of numerics.md §6."""
import json
import pathlib
import sys

out = pathlib.Path(sys.argv[1])
columns = []  # (title, {recipe: record})
for name, title in [("noncausal", "{input}"), ("causal", "{input}, causal"),
                    ("causal-sq-gt-sk", "causal s_q=1024 > s_k=768"),
                    ("outliers-smooth-k", "outliers, smooth_k")]:
    records = json.loads((out / f"{name}.json").read_text())["records"]
    inputs = list(dict.fromkeys(r["input"] for r in records))
    for inp in inputs:
        columns.append((title.format(input=inp),
                        {r["recipe"]: r for r in records if r["input"] == inp}))

recipes = list(columns[0][1].keys())
print("| recipe | " + " | ".join(t for t, _ in columns) + " |")
print("|---" * (len(columns) + 1) + "|")
for rec in recipes:
    cells = [f"{c[rec]['cos']:.4f} / {c[rec]['rel_l2']:.3f}" for _, c in columns]
    print(f"| `{rec}` | " + " | ".join(cells) + " |")
