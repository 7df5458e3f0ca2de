"""Summarise Nsight Compute's per-instruction warp sampling (`--page source --csv --print-source sass`):
total samples, samples by stall reason, and samples by kind of instruction (wgmmas by shape).

    python kernels/results/probes/ncu_stalls.py base.csv fold.csv
"""
import collections
import csv
import re
import sys


def load(path: str) -> list[dict[str, str]]:
    with open(path) as f:
        lines = [line for line in f if line.startswith('"')]
    rows = list(csv.reader(lines))
    header = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    return [dict(zip(rows[header], r)) for r in rows[header + 1:] if r and r[0].startswith("0x")]


def kind(source: str) -> str:
    op = re.sub(r"^@!?U?P\w+\s+", "", source.strip()).split(" ")[0]
    if op.startswith("HGMMA"):
        shape = op.split(".")[1]
        return f"HGMMA {shape}{' transposed A' if 'tnspA' in source else ''}"
    return op.split(".")[0]


for path in sys.argv[1:]:
    rows = load(path)
    total = sum(int(r["# Samples"]) for r in rows)
    reasons = collections.Counter()
    kinds = collections.Counter()
    for r in rows:
        kinds[kind(r["Source"])] += int(r["# Samples"])
        for key, value in r.items():
            if key.startswith("stall_") and "Not Issued" not in key:
                reasons[key[6:]] += int(value or 0)
    print(f"{path}: {total} samples")
    print("  by stall reason: " + ", ".join(f"{k} {v / total:.1%}" for k, v in reasons.most_common(8)))
    print("  by instruction:  " + ", ".join(f"{k} {v / total:.1%}" for k, v in kinds.most_common(12)))
