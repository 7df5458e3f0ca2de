"""Turn a real-server GPU run (tests/server_gpu/e2e.py) into server-e2e-h200.json, its plot and a table.

    python -m tests.server_gpu.report RUN_DIR --commit SHA [--out tests/server_gpu/results]

RUN_DIR holds what `e2e.py --pack` returned: `runs.tar.gz` (unpacked here) and `trace-<kernel>-<context>.json.gz`.
Every figure comes from the run: decode tok/s and TPOT from `ddtree-ops bench` (step = TPOT x acceptance
length: one verify step per accepted run of tokens), the breakdown from the profiler traces (breakdown.py;
what the GPU did not account for is the step less the GPU's busy time), same tokens from the greedy
outputs both servers gave the same prompts, and the verify counts from ddtree_kernels' statistics.
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
from pathlib import Path

from .breakdown import breakdown

HOST = "host and launch gaps (step - GPU busy)"


def load_run(run_dir: Path) -> dict:
    runs = run_dir / "runs"
    if not runs.exists():
        with tarfile.open(run_dir / "runs.tar.gz") as tf:
            tf.extractall(runs, filter="data")
    out = {}
    for kernel_dir in sorted(p for p in runs.iterdir() if p.is_dir() and (p / "result.json").exists()):
        result = json.loads((kernel_dir / "result.json").read_text())
        bench = kernel_dir / "bench" / "throughput.json"
        tokens = kernel_dir / "tokens.json"
        out[kernel_dir.name] = {
            "result": result,
            "bench": json.loads(bench.read_text()) if bench.exists() else {"points": []},
            "tokens": json.loads(tokens.read_text()) if tokens.exists() else {},
            "traces": {int(p.name.split("-")[-1].split(".")[0]): p
                       for p in run_dir.glob(f"trace-{kernel_dir.name}-*.json.gz")},
        }
    return out


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where two token lists differ (the shorter one's end if one is a prefix), or None."""
    first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    return min(len(a), len(b)) if first is None and len(a) != len(b) else first


def same_tokens(run: dict) -> dict:
    """Per context: equal, or the first index where the two kernels' greedy tokens differ."""
    ours, theirs = run.get("ddtree", {}).get("tokens", {}), run.get("sglang", {}).get("tokens", {})
    return {ctx: {"tokens": min(len(ours[ctx]), len(theirs[ctx])),
                  "first_difference": first_difference(ours[ctx], theirs[ctx])}
            for ctx in sorted(set(ours) & set(theirs), key=int)}


# Where the two servers part, the near-tie rule: a logit is a bf16 number (SGLang's lm_head writes bf16), and
# between 4 and 8 one bf16 step is 1/32; two steps of difference are within what a different summation order in
# any earlier layer moves a logit, so either choice is the model's greedy token within its own precision.
TIE_NATS = 1 / 16


def near_ties(run_dir: Path, tokens: dict, detail: dict) -> dict:
    """Apply the near-tie rule to e2e.py's tie check (`plain/ties.json`): at the first difference, the third
    computation's top two are exactly the two servers' choices, at most TIE_NATS apart; before it, that
    computation's greedy choice is the servers' common token at every position."""
    path = run_dir / "runs" / "plain" / "ties.json"
    ties = json.loads(path.read_text()) if path.exists() else {"positions": {}}
    out = {}
    for ctx, d in detail.items():
        first = d["first_difference"]
        if first is None:
            continue
        rec = ties["positions"].get(ctx)
        if rec is None:
            out[ctx] = {"near_tie": False, "why": "no tie check recorded"}
            continue
        ours, theirs = tokens["ddtree"][ctx], tokens["sglang"][ctx]
        start, prompt_len = rec["logprob_start_len"], rec["prompt_len"]
        ids = [e[1] for e in rec["input_token_logprobs"]]
        aligned = ids[prompt_len - start: prompt_len - start + first + 1] == ours[: first + 1]
        tops = rec["input_top_logprobs"][prompt_len - start: prompt_len - start + first + 1]
        agree = sum(1 for i, top in enumerate(tops[:first]) if top and top[0][1] == ours[i])
        top2 = tops[first] or []
        gap = abs(top2[0][0] - top2[1][0]) if len(top2) == 2 else None
        ok = (aligned and agree == first and gap is not None and gap <= TIE_NATS
              and {t[1] for t in top2} == {ours[first], theirs[first]})
        out[ctx] = {"near_tie": ok, "first_difference": first, "top2_gap_nats": gap, "rule_nats": TIE_NATS,
                    "third_agrees_before": f"{agree}/{first}", "aligned": aligned,
                    "choices": {"ours": ours[first], "sglang": theirs[first]},
                    "top2": [[t[1], t[0]] for t in top2]}
    return out


def rows(run: dict) -> list[dict]:
    out = []
    for kernel, data in run.items():
        profiles = {ctx: breakdown(path) for ctx, path in data["traces"].items()}
        for point in data["bench"]["points"]:
            tpot = point["tpot_ms"].get("p50") if point.get("tpot_ms") else None
            accept = point.get("accept_length") or 1.0
            step = tpot * accept if tpot else None
            row = {"context": point["context"], "kernel": "ddtree_kernels" if kernel == "ddtree" else "sglang",
                   "decode_tok_s": point.get("decode_tok_s"), "step_ms": step, "tpot_ms": tpot,
                   "accept_length": point.get("accept_length"), "breakdown_ms": {}}
            prof = profiles.get(point["context"])
            if prof is not None and step is not None:
                row["breakdown_ms"] = dict(prof["parts_ms"]) | {HOST: max(step - prof["gpu_busy_ms"], 0.0)}
                row["gpu_busy_ms"] = prof["gpu_busy_ms"]
                row["profiled_steps"] = prof["steps"]
            out.append(row)
    return sorted(out, key=lambda r: (r["kernel"], r["context"]))


def report(run_dir: Path, commit: str, note: str | None = None) -> dict:
    run = load_run(run_dir)
    ours = run["ddtree"]["result"]
    stats = ours.get("verify_stats") or []
    detail = same_tokens(run)
    ties = near_ties(run_dir, {k: v["tokens"] for k, v in run.items()}, detail)
    return {
        "commit": commit,
        **({"note": note} if note else {}),
        "gpu": "NVIDIA H200 (sm_90; our kernel's native Hopper path), torch 2.11.0+cu130, Triton 3.6.0",
        "server_args": ours["argv"],
        "verify_served": sum(int(s.get("served", 0)) for s in stats),
        "verify_declined": sum(sum((s.get("declined") or {}).values()) for s in stats),
        "verify_shapes": [shape for s in stats for shape in s.get("shapes", [])],
        # Equal tokens, or where they part a near tie by the rule above (near_ties): see same_tokens_rule.
        "same_tokens": bool(detail) and all(d["first_difference"] is None or ties.get(ctx, {}).get("near_tie")
                                            for ctx, d in detail.items()),
        "same_tokens_rule": (f"greedy tokens equal; where they part, the target served without speculative "
                             f"decoding ranks the two choices top-2, at most {TIE_NATS} nat apart, and agrees "
                             f"with every token before"),
        "same_tokens_detail": {ctx: d | ({"near_tie": ties[ctx]} if ctx in ties else {})
                               for ctx, d in detail.items()},
        "start_s": {k: v["result"].get("start_s") for k, v in run.items()},
        "rows": rows(run),
    }


def plot(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    for kernel, style in (("ddtree_kernels", "o-"), ("sglang", "s--")):
        pts = [r for r in data["rows"] if r["kernel"] == kernel and r["decode_tok_s"]]
        a.plot([r["context"] for r in pts], [r["decode_tok_s"] for r in pts], style,
               label="our kernel" if kernel == "ddtree_kernels" else "SGLang's Triton verify")
    a.set(xscale="log", yscale="log", xlabel="context (tokens)", ylabel="decode tok/s (1 request)",
          title="DDTree server on an H200: decode speed")
    a.grid(True, alpha=0.3)
    a.legend()
    # Our kernel's steps only: SGLang's (18-360 ms) would flatten them; their totals go in the labels.
    bars = [r for r in data["rows"] if r["breakdown_ms"] and r["kernel"] == "ddtree_kernels"]
    theirs = {r["context"]: r["step_ms"] for r in data["rows"] if r["kernel"] == "sglang" and r["step_ms"]}
    parts = sorted({p for r in bars for p in r["breakdown_ms"]},
                   key=lambda p: -max(r["breakdown_ms"].get(p, 0) for r in bars))
    labels = [f"{r['context'] // 1000}k" + (f"\n(SGLang's path: {theirs[r['context']]:.0f} ms)"
                                            if r["context"] in theirs else "") for r in bars]
    bottom = [0.0] * len(bars)
    colors = plt.get_cmap("tab20").colors
    for i, part in enumerate(parts):
        vals = [r["breakdown_ms"].get(part, 0.0) for r in bars]
        b.bar(labels, vals, bottom=bottom, label=part, color=colors[i % len(colors)])
        bottom = [x + y for x, y in zip(bottom, vals, strict=True)]
    b.set(ylabel="ms a decode step", title="where a step goes with our kernel (profiled)")
    b.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(data: dict) -> str:
    lines = ["| context | our kernel: tok/s (step ms) | SGLang's path: tok/s (step ms) | speed-up |",
             "|---|---|---|---|"]
    by = {(r["kernel"], r["context"]): r for r in data["rows"]}
    for ctx in sorted({r["context"] for r in data["rows"]}):
        o, s = by.get(("ddtree_kernels", ctx)), by.get(("sglang", ctx))
        cell = lambda r: f"{r['decode_tok_s']:.1f} ({r['step_ms']:.2f})" if r and r["decode_tok_s"] else "—"  # noqa: E731
        speed = f"{o['decode_tok_s'] / s['decode_tok_s']:.1f}×" if o and s and s["decode_tok_s"] else "—"
        lines.append(f"| {ctx:,} | {cell(o)} | {cell(s)} | {speed} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--commit", required=True, help="the commit whose tree the GPU run ran")
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("results"))
    ap.add_argument("--name", default="server-e2e-h200")
    ap.add_argument("--note", default=None, help="provenance, where RUN_DIR joins runs of more than one call")
    args = ap.parse_args(argv)
    data = report(args.run_dir, args.commit, args.note)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(data, indent=1) + "\n")
    plot(data, args.out / f"{args.name}.png")
    print(markdown(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
