"""Decode throughput of a live SGLang endpoint against context length and concurrency.

    ddtree-ops bench --endpoint http://127.0.0.1:30000 --contexts 8192,32768,65536,131072,185000 \\
        --concurrency 1,4 --output-len 256 --out bench/ [--previous old/throughput.json]

Each request sends exactly L prompt tokens as `input_ids` to SGLang's native /generate
(random ids in [100, vocab); no tokenizer needed) with ignore_eos, and streams the answer.
Metrics follow `python -m sglang.bench_serving`: TTFT = first chunk - send; TPOT =
(latency - TTFT) / (output tokens - 1); ITL = gaps between streamed chunks (with speculative
decoding one chunk may carry several accepted tokens, so ITL >= TPOT); output throughput =
output tokens of a point / its wall time. Decode tok/s per request = 1 / TPOT.
A point runs `rounds` rounds one after another, each `concurrency` requests at once; its decode tok/s is
the median over rounds of each round's median, with the lowest and highest round as its spread.
Acceptance length = completion_tokens / spec_verify_ct from the final meta_info.
Writes throughput.json (after every point: partial results are kept), throughput.md and
throughput.png (decode tok/s and TPOT against context length).
"""

from __future__ import annotations

import itertools
import json
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .endpoint import Endpoint, EndpointError, EndpointUnreachable


@dataclass
class RequestResult:
    ok: bool
    ttft: float = 0.0
    latency: float = 0.0
    output_tokens: int = 0
    itls: list[float] = field(default_factory=list)
    verify_ct: int = 0
    error: str = ""
    unreachable: bool = False  # nothing answered in HTTP (EndpointUnreachable)

    @property
    def tpot(self) -> float | None:
        return (self.latency - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else None


@dataclass
class Point:
    context: int
    concurrency: int
    requests: int
    ok: int
    wall_s: float
    output_throughput: float  # output tokens / wall time of the point
    decode_tok_s: float | None  # median over rounds of each round's median 1 / TPOT
    decode_tok_s_rounds: list[float]  # each round's median 1 / TPOT, in the order run (the spread)
    ttft_ms: dict
    tpot_ms: dict
    itl_ms: dict
    accept_length: float | None
    errors: list[str] = field(default_factory=list)
    unreachable: bool = False  # no request of the point got an HTTP answer


def _pct(values: list[float]) -> dict:
    if not values:
        return {}
    s = sorted(values)

    def q(p: float) -> float:
        return s[min(len(s) - 1, max(0, round(p * (len(s) - 1))))] * 1e3

    return {"mean": statistics.fmean(s) * 1e3, "p50": q(0.5), "p90": q(0.9), "p99": q(0.99)}


def request_seed(context: int, concurrency: int, round_: int, index: int) -> int:
    """The seed of one request's prompt: the same point, round and slot send the same prompt (a warm cache)."""
    return hash((context, concurrency, round_, index))


def prompt_ids(context: int, vocab: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, vocab) for _ in range(context)]


def one_request(ep: Endpoint, context: int, output_len: int, vocab: int, seed: int) -> RequestResult:
    body = {
        "input_ids": prompt_ids(context, vocab, seed),
        "sampling_params": {"max_new_tokens": output_len, "temperature": 0, "ignore_eos": True},
        "stream": True,
    }
    sent = time.perf_counter()
    first, last, meta, stamps = None, None, {}, []
    try:
        for t, event in ep.stream("/generate", body):
            stamps.append(t)
            first = first or t
            last = t
            meta = event.get("meta_info") or meta
    except EndpointError as exc:
        return RequestResult(False, error=f"context {context}: {exc}", unreachable=isinstance(exc, EndpointUnreachable))
    if first is None:
        return RequestResult(False, error=f"context {context}: POST {ep.url}/generate streamed no token")
    tokens = int(meta.get("completion_tokens") or 0)
    itls = [b - a for a, b in itertools.pairwise(stamps)]
    return RequestResult(True, first - sent, last - sent, tokens, itls, int(meta.get("spec_verify_ct") or 0))


def _round_decode(results: list[RequestResult]) -> float | None:
    rates = [1 / r.tpot for r in results if r.ok and r.tpot]
    return statistics.median(rates) if rates else None


def measure_point(ep: Endpoint, context: int, concurrency: int, output_len: int, vocab: int, rounds: int,
                  progress=None) -> Point:
    """`rounds` rounds one after another, each `concurrency` requests at once (a closed port: one round)."""
    t0 = time.perf_counter()
    results: list[RequestResult] = []
    per_round: list[float] = []
    with ThreadPoolExecutor(concurrency) as pool:
        for k in range(rounds):
            seeds = [request_seed(context, concurrency, k, i) for i in range(concurrency)]
            futures = [pool.submit(one_request, ep, context, output_len, vocab, seed) for seed in seeds]
            batch = []
            for f in futures:
                batch.append(f.result())
                if progress is not None:
                    progress.update(1)
            results += batch
            rate = _round_decode(batch)
            if rate is not None:
                per_round.append(rate)
            if all(r.unreachable for r in batch):
                break
    wall = time.perf_counter() - t0
    good = [r for r in results if r.ok]
    tpots = [r.tpot for r in good if r.tpot]
    accept = [r.output_tokens / r.verify_ct for r in good if r.verify_ct]
    return Point(
        context, concurrency, len(results), len(good), wall,
        output_throughput=sum(r.output_tokens for r in good) / wall if wall > 0 else 0.0,
        decode_tok_s=statistics.median(per_round) if per_round else None,
        decode_tok_s_rounds=per_round,
        ttft_ms=_pct([r.ttft for r in good]),
        tpot_ms=_pct(tpots),
        itl_ms=_pct([x for r in good for x in r.itls]),
        accept_length=statistics.fmean(accept) if accept else None,
        errors=[r.error for r in results if not r.ok][:5],
        unreachable=all(r.unreachable for r in results),
    )


def compare(points: list[Point], previous: dict) -> dict[tuple[int, int], float]:
    """(context, concurrency) -> decode tok/s now / before, where both runs have the point."""
    before = {(p["context"], p["concurrency"]): p.get("decode_tok_s") for p in previous.get("points", [])}
    return {(p.context, p.concurrency): p.decode_tok_s / before[(p.context, p.concurrency)]
            for p in points if p.decode_tok_s and before.get((p.context, p.concurrency))}


def markdown(points: list[Point], ratios: dict, endpoint: str) -> str:
    def num(x: float | None, spec: str = ".1f", suffix: str = "") -> str:
        return "—" if x is None else f"{x:{spec}}{suffix}"

    def trio(d: dict) -> str:
        return f"{d['p50']:.0f} / {d['p90']:.0f} / {d['p99']:.0f}" if d else "—"

    def spread(p: Point) -> str:
        r = p.decode_tok_s_rounds
        return f"{num(p.decode_tok_s)} ({min(r):.1f}–{max(r):.1f}, {len(r)} rounds)" if r else "—"

    lines = [
        f"Throughput of {endpoint}; decode tok/s is the median of the rounds (lowest–highest round); times in ms "
        "(p50 / p90 / p99 over every request).",
        "",
        "| context | concurrency | ok | decode tok/s | output tok/s | TTFT | TPOT | ITL | accept length "
        "| vs previous |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in points:
        lines.append(
            f"| {p.context} | {p.concurrency} | {p.ok}/{p.requests} | {spread(p)} "
            f"| {num(p.output_throughput)} | {trio(p.ttft_ms)} | {trio(p.tpot_ms)} | {trio(p.itl_ms)} "
            f"| {num(p.accept_length, '.2f')} | {num(ratios.get((p.context, p.concurrency)), '.2f', '×')} |"
        )
    return "\n".join(lines) + "\n"


def plot(points: list[Point], path: Path, title: str = "") -> None:
    try:
        import matplotlib
    except ImportError:  # hosts get ddtree-ops without it; the JSON and markdown carry the numbers
        print(f"no plot written to {path}: install ddtree-ops[plot] (matplotlib) for it", file=sys.stderr)
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for c in sorted({p.concurrency for p in points}):
        pts = sorted((p.context, p) for p in points if p.concurrency == c and p.decode_tok_s)
        if pts:
            xs, med = [x for x, _ in pts], [p.decode_tok_s for _, p in pts]
            lo = [m - min(p.decode_tok_s_rounds or [m]) for m, (_, p) in zip(med, pts, strict=True)]
            hi = [max(p.decode_tok_s_rounds or [m]) - m for m, (_, p) in zip(med, pts, strict=True)]
            a.errorbar(xs, med, yerr=[lo, hi], fmt="o-", capsize=3, label=f"concurrency {c} (median, round range)")
            b.plot([x for x, _ in pts], [p.tpot_ms["p50"] for _, p in pts], "o-", label=f"concurrency {c}")
    a.set(xscale="log", xlabel="context (prompt tokens)", ylabel="decode tok/s a request (1 / TPOT), median of rounds")
    b.set(xscale="log", xlabel="context (prompt tokens)", ylabel="TPOT p50 (ms)")
    for ax in (a, b):
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _served_model(ep: Endpoint) -> str:
    try:
        return ep.get_json("/v1/models")["data"][0]["id"]
    except (EndpointError, KeyError, IndexError, TypeError, ValueError):
        return "model unknown"


def run_throughput(ep: Endpoint, *, contexts: list[int], concurrency: list[int], output_len: int = 256,
                   rounds: int = 3, vocab: int = 32000, out: str | Path = "throughput",
                   previous: str | Path | None = None) -> list[Point]:
    from tqdm import tqdm

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    prev = json.loads(Path(previous).read_text()) if previous else {}
    points: list[Point] = []
    total = sum(c * rounds for c in concurrency) * len(contexts)
    with tqdm(total=total, desc="requests", unit="req") as bar:
        for L in contexts:
            for c in concurrency:
                bar.set_postfix(context=L, concurrency=c)
                points.append(measure_point(ep, L, c, output_len, vocab, rounds, bar))
                (out / "throughput.json").write_text(json.dumps(
                    {"endpoint": ep.url, "output_len": output_len, "points": [asdict(p) for p in points]}, indent=1))
                if all(p.unreachable for p in points):  # nothing answers in HTTP: a closed port or a wrong address
                    return points
    if not any(p.ok for p in points):  # nothing measured: no table or plot of empty points
        return points
    ratios = compare(points, prev)
    (out / "throughput.md").write_text(markdown(points, ratios, ep.url))
    plot(points, out / "throughput.png", title=f"{ep.url}, {_served_model(ep)}, {time.strftime('%Y-%m-%d')}")
    return points
