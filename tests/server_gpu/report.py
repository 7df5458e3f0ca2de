"""Turn a real-server GPU run (tests/server_gpu/e2e.py) into server-e2e-h200.json, its plot and a table.

    python -m tests.server_gpu.report RUN_DIR [RUN_DIR ...] --commit SHA [--out tests/server_gpu/results]

RUN_DIR holds what `e2e.py --pack` returned: `runs.tar.gz` (unpacked here) and `trace-<run>-<context>.json.gz`;
several RUN_DIRs (one run's device calls) are joined: a run of the same name in a later call adds its contexts
(e.g. 185k in a call of its own) and replaces the earlier call's figures at a context both measured.
A run is `<kernel>` (DDTREE) or `<kernel>-dflash` (the same drafter as a DFlash chain), `-dsa` appended where
the DSA checkpoint itself was served (e2e.py --attention dsa); `--dense RUN_DIR` adds a dense-view run of the same
machine beside a DSA report (`dense_view_rows`).
Every figure comes from the run: decode tok/s and TPOT from `ddtree-ops bench` (step = TPOT x acceptance
length: one verify step per accepted run of tokens), the breakdown from the profiler traces (breakdown.py;
what the GPU did not account for is the step less the GPU's busy time), same tokens from the greedy
outputs both servers gave the same prompts, and the verify counts from ddtree_kernels' statistics.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tarfile
from pathlib import Path

from .breakdown import breakdown

HOST = "host and launch gaps (step - GPU busy)"


def _unpack(run_dir: Path) -> Path:
    runs = run_dir / "runs"
    if not runs.exists():
        with tarfile.open(run_dir / "runs.tar.gz") as tf:
            tf.extractall(runs, filter="data")
    return runs


def load_run(*run_dirs: Path) -> dict:
    """Per run name: its result.json, bench, greedy tokens and profiler traces."""
    out = {}
    for run_dir in run_dirs:
        runs = _unpack(run_dir)
        for d in sorted(p for p in runs.iterdir() if p.is_dir() and (p / "result.json").exists()):
            result = json.loads((d / "result.json").read_text())
            bench = d / "bench" / "throughput.json"
            tokens = d / "tokens.json"
            trace = re.compile(rf"trace-{re.escape(d.name)}-(\d+)\.json\.gz$")
            entry = {
                "result": result,
                "bench": json.loads(bench.read_text()) if bench.exists() else {"points": []},
                "tokens": json.loads(tokens.read_text()) if tokens.exists() else {},
                "traces": {int(m.group(1)): p for p in run_dir.glob("trace-*.json.gz")
                           if (m := trace.match(p.name))},
            }
            out[d.name] = _join(out[d.name], entry) if d.name in out else entry
    return out


def _join(earlier: dict, later: dict) -> dict:
    """One run served over two calls: every context either measured, the later call's where both did; the
    verify statistics of both (each call's server counted its own)."""
    points = {p["context"]: p for p in [*earlier["bench"]["points"], *later["bench"]["points"]]}
    stats = [*(earlier["result"].get("verify_stats") or []), *(later["result"].get("verify_stats") or [])]
    return {"result": later["result"] | {"verify_stats": stats},
            "bench": later["bench"] | {"points": [points[c] for c in sorted(points)]},
            "tokens": earlier["tokens"] | later["tokens"],
            "traces": earlier["traces"] | later["traces"]}


def stand_in(*run_dirs: Path) -> dict:
    """The target stand-in the runs served (e2e.py's summary.json), the same in every call."""
    seen = {}
    for run_dir in run_dirs:
        summary = _unpack(run_dir) / "summary.json"
        if summary.exists() and (si := json.loads(summary.read_text()).get("stand_in")):
            seen[json.dumps(si, sort_keys=True)] = si
    if len(seen) > 1:
        raise ValueError(f"the runs served different stand-ins: {sorted(seen)}; report each on its own")
    return next(iter(seen.values()), {"name": "small", "layers": 8})


def gpu_of(*run_dirs: Path, given: str | None = None) -> str:
    """The card the runs served on: e2e.py's summary.json records it; `given` (--gpu) for calls before it did."""
    seen = {json.loads(s.read_text()).get("gpu") for d in run_dirs if (s := _unpack(d) / "summary.json").exists()}
    seen.discard(None)
    if len(seen) > 1:
        raise ValueError(f"the runs served on different cards: {sorted(seen)}; report each on its own")
    if given and seen and given not in seen:
        raise ValueError(f"--gpu {given!r} contradicts the card the runs recorded: {seen.pop()!r}")
    if not (gpu := given or next(iter(seen), None)):
        raise ValueError("the runs do not record their card (an e2e.py before it did): pass --gpu "
                         "'NAME (sm_XY), torch X, Triton Y' as the call's log shows it")
    return gpu


def card_name(gpu: str) -> str:
    """'NVIDIA H100 80GB HBM3 (sm_90), ...' -> 'H100', for a plot's title."""
    words = [w for w in gpu.split("(")[0].split() if w != "NVIDIA"]
    return words[0] if words else gpu


def attention_of(name: str, result: dict) -> str:
    return result.get("attention") or ("dsa" if name.endswith("-dsa") else "dense-view")


def ours_run(run: dict) -> str:
    """Our kernel's DDTREE run: the DSA checkpoint's where it was served, else the dense view's."""
    return "ddtree-dsa" if "ddtree-dsa" in run else "ddtree"


def algorithm_of(name: str, result: dict) -> str:
    return result.get("algorithm") or ("DFLASH" if "-dflash" in name else "DDTREE")


def kernel_of(name: str, result: dict) -> str:
    return "ddtree_kernels" if (result.get("kernel") or name.split("-")[0]) == "ddtree" else "sglang"


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where two token lists differ (the shorter one's end if one is a prefix), or None."""
    first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    return min(len(a), len(b)) if first is None and len(a) != len(b) else first


def reference_run(run: dict) -> str:
    """What our DDTREE server's tokens are held to: the target served without speculation (`target`) if it ran,
    else SGLang's verify, else our DFLASH chain; for the DSA checkpoint, SGLang's own DSA serving without
    speculation (`sglang-dsa`)."""
    if ours_run(run) == "ddtree-dsa":
        return "sglang-dsa"
    return next((name for name in ("target", "sglang") if name in run), "ddtree-dflash")


def budget_of(name: str, result: dict) -> int | None:
    """A DDTREE run's node budget, as its result.json records it (None for a chain, and for runs before e2e.py
    recorded it)."""
    return result.get("budget") if algorithm_of(name, result) == "DDTREE" else None


def same_tokens_by_run(run: dict) -> dict:
    """Each speculative run's greedy tokens against the reference's, per context (compare_tokens)."""
    reference = run.get(reference_run(run), {}).get("tokens", {})
    return {name: compare_tokens(data["tokens"], reference) for name, data in sorted(run.items())
            if name != reference_run(run) and data["tokens"] and data["result"].get("algorithm") != "none"}


def compare_tokens(ours: dict, theirs: dict) -> dict:
    """Per context both hold: how many tokens compared, and the first index where they differ (None: equal)."""
    return {ctx: {"tokens": min(len(ours[ctx]), len(theirs[ctx])),
                  "first_difference": first_difference(ours[ctx], theirs[ctx])}
            for ctx in sorted(set(ours) & set(theirs), key=int)}


def same_tokens(run: dict) -> dict:
    """Per context: equal, or the first index where our DDTREE server's and the reference's greedy tokens differ."""
    return compare_tokens(run.get(ours_run(run), {}).get("tokens", {}),
                          run.get(reference_run(run), {}).get("tokens", {}))


# Where the two servers part, the near-tie rule: a logit is a bf16 number (SGLang's lm_head writes bf16), and
# between 4 and 8 one bf16 step is 1/32; two steps of difference are within what a different summation order in
# any earlier layer moves a logit, so either choice is the model's greedy token within its own precision.
TIE_NATS = 1 / 16


def near_ties(run_dir: Path, tokens: dict, detail: dict, reference: str = "sglang") -> dict:
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
        ours, theirs = tokens[ours_run(tokens)][ctx], tokens[reference][ctx]
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
                    "choices": {"ours": ours[first], reference: theirs[first]},
                    "top2": [[t[1], t[0]] for t in top2]}
    return out


def rows(run: dict) -> list[dict]:
    out = []
    for name, data in run.items():
        profiles = {ctx: breakdown(path) for ctx, path in data["traces"].items()}
        for point in data["bench"]["points"]:
            tpot = point["tpot_ms"].get("p50") if point.get("tpot_ms") else None
            accept = point.get("accept_length") or 1.0
            step = tpot * accept if tpot else None
            row = {"context": point["context"], "algorithm": algorithm_of(name, data["result"]),
                   "budget": budget_of(name, data["result"]), "run": name,
                   "kernel": kernel_of(name, data["result"]), "attention": attention_of(name, data["result"]),
                   "decode_tok_s": point.get("decode_tok_s"),
                   "step_ms": step, "tpot_ms": tpot, "accept_length": point.get("accept_length"),
                   "gpu_busy_ms": None, "breakdown_ms": {}}
            prof = profiles.get(point["context"])
            if prof is not None and step is not None:
                row["breakdown_ms"] = dict(prof["parts_ms"]) | {HOST: max(step - prof["gpu_busy_ms"], 0.0)}
                row["gpu_busy_ms"] = prof["gpu_busy_ms"]
                row["step_over_gpu_busy"] = step / prof["gpu_busy_ms"] if prof["gpu_busy_ms"] else None
                row["profiled_steps"] = prof["steps"]
                row["host_syncs"] = prof["host_syncs"]
            out.append(row)
    return sorted(out, key=lambda r: (r["algorithm"] != "DDTREE", r["kernel"], r["budget"] or 0, r["context"]))


def _verify_stats(run: dict) -> list[dict]:
    return [s for name, data in run.items() if kernel_of(name, data["result"]) == "ddtree_kernels"
            for s in data["result"].get("verify_stats") or []]


def same_as_before(run: dict, before: dict) -> dict:
    """Per context: our DDTREE server's greedy tokens now against a run before a change (the same launch)."""
    return compare_tokens(run.get(ours_run(run), {}).get("tokens", {}),
                          before.get(ours_run(before), {}).get("tokens", {}))


def same_as_training(run: dict, si: dict) -> dict:
    """Per context: our DDTREE server's greedy tokens against the trained target's own PyTorch forward after the
    same prompt (train_pair.py's greedy_after_serve_prompt): the served model is the one that was trained."""
    return compare_tokens(run.get(ours_run(run), {}).get("tokens", {}),
                          si["training"].get("greedy_after_serve_prompt", {}))


def report(*run_dirs: Path, commit: str, note: str | None = None, before: tuple[Path, ...] = (),
           dense: tuple[Path, ...] = (), gpu: str | None = None) -> dict:
    run = load_run(*run_dirs)
    earlier = load_run(*before) if before else None
    ours = run[ours_run(run)]["result"]
    attention = attention_of(ours_run(run), ours)
    stats = _verify_stats(run)
    reference = reference_run(run)
    detail = same_tokens(run)
    with_ties = [d for d in run_dirs if (d / "runs" / "plain" / "ties.json").exists()]  # the call that ran it
    ties = near_ties((with_ties or run_dirs)[-1], {k: v["tokens"] for k, v in run.items()}, detail, reference)
    si = stand_in(*run_dirs)
    return {
        "commit": commit,
        **({"note": note} if note else {}),
        "gpu": gpu_of(*run_dirs, *dense, given=gpu),
        "stand_in": si["name"],
        "layers": si["layers"],
        "attention": attention,
        **({"reference": reference} if attention == "dsa" else {}),
        "server_args": ours["argv"],
        "server_args_by_run": {k: v["result"].get("argv") for k, v in run.items()},
        "verify_served": sum(int(s.get("served", 0)) for s in stats),
        "verify_declined": sum(sum((s.get("declined") or {}).values()) for s in stats),
        "verify_shapes": [shape for s in stats for shape in s.get("shapes", [])],
        "verify_served_dsa": sum(int(s.get("served_dsa", 0)) for s in stats),
        # Equal tokens, or where they part a near tie by the rule above (near_ties): see same_tokens_rule;
        # None where the reference did not run.
        "same_tokens_reference": reference,
        "same_tokens": None if reference not in run else bool(detail) and all(
            d["first_difference"] is None or ties.get(ctx, {}).get("near_tie") for ctx, d in detail.items()),
        "same_tokens_rule": (f"greedy tokens equal; where they part, the target served without speculative "
                             f"decoding ranks the two choices top-2, at most {TIE_NATS} nat apart, and agrees "
                             f"with every token before"),
        "same_tokens_detail": {ctx: d | ({"near_tie": ties[ctx]} if ctx in ties else {})
                               for ctx, d in detail.items()},
        "same_tokens_by_run": same_tokens_by_run(run),
        "start_s": {k: v["result"].get("start_s") for k, v in run.items()},
        **({"same_tokens_as_before": same_as_before(run, earlier)} if earlier else {}),
        **({"same_tokens_as_training": same_as_training(run, si)} if "training" in si else {}),
        "rows": rows(run),
        **({"before_rows": rows(earlier)} if earlier else {}),
        **({"dense_view_rows": rows(load_run(*dense))} if dense else {}),
    }


SERIES = {("DDTREE", "ddtree_kernels"): ("our kernel, DDTree", "o-"),
          ("DDTREE", "sglang"): ("SGLang's Triton verify, DDTree", "s--"),
          ("DFLASH", "ddtree_kernels"): ("our kernel, DFlash chain", "^:")}


def plot(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    for (algorithm, kernel), (label, style) in SERIES.items():
        pts = [r for r in data["rows"] if (r["algorithm"], r["kernel"]) == (algorithm, kernel) and r["decode_tok_s"]]
        if pts:
            a.plot([r["context"] for r in pts], [r["decode_tok_s"] for r in pts], style, label=label)
    dense = [r for r in data.get("dense_view_rows", []) if r["kernel"] == "ddtree_kernels" and r["decode_tok_s"]]
    if dense:  # a DSA report's dense-view run of the same machine
        a.plot([r["context"] for r in dense], [r["decode_tok_s"] for r in dense], "x--", label="our kernel, DDTree, "
               "dense-MLA view")
    before = [r for r in data.get("before_rows", []) if r["algorithm"] == "DDTREE" and r["decode_tok_s"]]
    if before:  # the same launch before a change (--before)
        a.plot([r["context"] for r in before], [r["decode_tok_s"] for r in before], "v--", color="grey",
               label="our kernel, DDTree, before the change")
    speeds = [r["decode_tok_s"] for r in [*data["rows"], *dense, *before] if r["decode_tok_s"]]
    flat = bool(speeds) and max(speeds) < 3 * min(speeds)  # a log axis of a narrow range reads as noise
    a.set(xscale="log", yscale="linear" if flat else "log", xlabel="context (tokens)",
          ylabel="decode tok/s (1 request)",
          title=f"{data.get('layers', 8)}-layer stand-in on {card_name(data['gpu'])}: decode speed"
          + (" (DSA)" if data.get("attention") == "dsa" else ""))
    if flat:
        a.set_ylim(bottom=0)
    a.grid(True, alpha=0.3)
    a.legend()
    # Our kernel's steps only: SGLang's (18-360 ms) would flatten them; their totals go in the labels.
    bars = [r for r in data["rows"] if r["breakdown_ms"] and r["kernel"] == "ddtree_kernels"]
    theirs = {r["context"]: r["step_ms"] for r in data["rows"] if r["kernel"] == "sglang" and r["step_ms"]}
    parts = sorted({p for r in bars for p in r["breakdown_ms"]},
                   key=lambda p: -max(r["breakdown_ms"].get(p, 0) for r in bars))
    labels = [("chain " if r["algorithm"] == "DFLASH" else "") + f"{r['context'] // 1000}k"
              + (f"\n(SGLang's path: {theirs[r['context']]:.0f} ms)" if r["context"] in theirs else "") for r in bars]
    bottom = [0.0] * len(bars)
    colors = plt.get_cmap("tab20").colors
    for i, part in enumerate(parts):
        vals = [r["breakdown_ms"].get(part, 0.0) for r in bars]
        b.bar(labels, vals, bottom=bottom, label=part, color=colors[i % len(colors)])
        bottom = [x + y for x, y in zip(bottom, vals, strict=True)]
    if bars:
        b.set(ylabel="ms a decode step", title="where a step goes with our kernel (profiled)")
        b.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:  # no profile in the run: what a step accepted, the other half of tokens/s
        for (algorithm, kernel), (label, style) in SERIES.items():
            pts = [r for r in data["rows"] if (r["algorithm"], r["kernel"]) == (algorithm, kernel)
                   and r.get("accept_length")]
            if pts:
                b.plot([r["context"] for r in pts], [r["accept_length"] for r in pts], style, label=label)
        b.set(xscale="log", xlabel="context (tokens)", ylabel="accepted tokens a step", ylim=(0, None),
              title="accepted length (no profile in this run)")
        b.grid(True, alpha=0.3)
        if b.get_lines():
            b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(data: dict) -> str:
    """One line a context: each run's tok/s (step ms), and the step over the GPU's busy time where profiled."""
    present = [key for key in SERIES if any((r["algorithm"], r["kernel"]) == key for r in data["rows"])]
    lines = ["| context | " + " | ".join(f"{SERIES[k][0]}: tok/s (step ms, step / GPU busy)" for k in present) + " |",
             "|---|" + "---|" * len(present)]
    by = {(r["algorithm"], r["kernel"], r["context"]): r for r in data["rows"]}

    def cell(r: dict | None) -> str:
        if not r or not r["decode_tok_s"]:
            return "—"
        ratio = f", {r['step_over_gpu_busy']:.2f}×" if r.get("step_over_gpu_busy") else ""
        return f"{r['decode_tok_s']:.1f} ({r['step_ms']:.2f}{ratio})"

    for ctx in sorted({r["context"] for r in data["rows"]}):
        lines.append(f"| {ctx:,} | " + " | ".join(cell(by.get((*k, ctx))) for k in present) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dirs", type=Path, nargs="+", metavar="RUN_DIR")
    ap.add_argument("--commit", required=True, help="the commit whose tree the GPU run ran")
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("results"))
    ap.add_argument("--name", default="server-e2e-h200")
    ap.add_argument("--note", default=None, help="provenance, where the RUN_DIRs are more than one call")
    ap.add_argument("--before", type=Path, nargs="+", default=(), metavar="RUN_DIR",
                    help="a run before a change (its RUN_DIRs): same_tokens_as_before compares our DDTREE tokens, "
                         "before_rows holds its figures")
    ap.add_argument("--dense", type=Path, nargs="+", default=(), metavar="RUN_DIR",
                    help="a dense-view run of the same machine, reported beside a DSA run (dense_view_rows)")
    ap.add_argument("--gpu", default=None,
                    help="the card, for runs whose summary.json does not record it (e2e.py before it did)")
    args = ap.parse_args(argv)
    data = report(*args.run_dirs, commit=args.commit, note=args.note, before=tuple(args.before),
                  dense=tuple(args.dense), gpu=args.gpu)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(data, indent=1) + "\n")
    plot(data, args.out / f"{args.name}.png")
    print(markdown(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
