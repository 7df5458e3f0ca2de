"""Decode throughput of a live SGLang endpoint against context length and concurrency.

    ddtree-ops bench --endpoint http://127.0.0.1:30000 --contexts 8192,32768,65536,131072,185000 \\
        --concurrency 1,4 --output-len 256 --out bench/ [--previous old/throughput.json] [--deadline 1800]

Each request sends exactly L prompt tokens as `input_ids` to SGLang's native /generate
(random ids in [100, vocab); no tokenizer needed) with ignore_eos, and streams the answer.
Metrics follow `python -m sglang.bench_serving`: TTFT = first chunk - send; TPOT =
(latency - TTFT) / (output tokens - 1); ITL = gaps between streamed chunks (with speculative
decoding one chunk may carry several accepted tokens, so ITL >= TPOT); output throughput =
output tokens of a point / its wall time. Decode tok/s per request = 1 / TPOT.
A point runs `rounds` rounds one after another, each `concurrency` requests at once; its decode tok/s is
the median over rounds of each round's median, with the lowest and highest round as its spread.
Acceptance length = completion_tokens / spec_verify_ct from the final meta_info.

Two bounds keep a broken endpoint from holding the run for hours: a round in which every request failed
(any cause: refused, timed out, HTTP 500, an HTML page, a broken stream) ends its point and the run, since the
next points would only send longer prompts to the same fault; and an overall deadline (`deadline_s`), past
which no request is sent and those in flight are cut off, bounds the whole run beside the per-request timeout.
Either way the run writes what it measured and says why it stopped (`BenchRun.stopped`).

Writes throughput.json (the run's endpoint, model, release, date, settings and points; rewritten after every
point, so partial results are kept), throughput.md and throughput.png (decode tok/s, its spread across rounds
and TPOT against context length).
"""

from __future__ import annotations

import datetime
import itertools
import json
import math
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .endpoint import Endpoint, EndpointError, EndpointTimeout, EndpointUnreachable

DEFAULT_DEADLINE_S = 1800.0  # the whole run; the default 5 contexts x 2 concurrencies x 3 rounds take ~10-15 min


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
    sent: bool = True  # False: the deadline had passed before it was due
    cut: bool = False  # the deadline cut it off

    @property
    def tpot(self) -> float | None:
        return (self.latency - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else None


@dataclass
class Point:
    context: int
    concurrency: int
    requests: int  # requests sent
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
    cut_short: str = ""  # why the point ran fewer rounds than asked, or the deadline cut requests off ("": neither)


@dataclass
class BenchRun:
    """One run: what it measured, against what, and why it stopped early (None: it ran every point)."""
    endpoint: str
    model: str | None  # the first model /v1/models lists
    release: str | None  # the deploy's release id (--release), else the SGLang build /server_info reports
    release_from: str | None  # "--release", "/server_info version" or None
    date: str  # when the run started, ISO 8601 with the UTC offset
    output_len: int
    rounds: int
    contexts: list[int]
    concurrency: list[int]
    deadline_s: float
    timeout_s: float  # a request's own bound
    points: list[Point] = field(default_factory=list)
    stopped: str | None = None
    files: list[str] = field(default_factory=list)  # what the run wrote, in the order written

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)


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


def one_request(ep: Endpoint, context: int, output_len: int, vocab: int, seed: int,
                deadline: float = math.inf) -> RequestResult:
    """One streamed /generate; `deadline` (time.monotonic()) bounds it beside the endpoint's timeout."""
    left = deadline - time.monotonic()
    if left <= 0:
        return RequestResult(False, error=f"context {context}: not sent, the run's deadline had passed", sent=False)
    body = {
        "input_ids": prompt_ids(context, vocab, seed),
        "sampling_params": {"max_new_tokens": output_len, "temperature": 0, "ignore_eos": True},
        "stream": True,
    }
    sent = time.perf_counter()
    first, last, meta, stamps = None, None, {}, []
    try:
        for t, event in ep.stream("/generate", body, timeout=min(ep.timeout, left)):
            stamps.append(t)
            first = first or t
            last = t
            meta = event.get("meta_info") or meta
            if time.monotonic() >= deadline:
                return RequestResult(False, error=f"context {context}: cut off by the run's deadline after "
                                                  f"{int(meta.get('completion_tokens') or 0)} tokens", cut=True)
    except EndpointError as exc:
        if isinstance(exc, EndpointTimeout) and left < ep.timeout and time.monotonic() >= deadline - 0.1:
            return RequestResult(False, error=f"context {context}: cut off by the run's deadline ({exc})", cut=True)
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
                  progress=None, deadline: float = math.inf) -> Point:
    """`rounds` rounds one after another, each `concurrency` requests at once. A round in which every request
    failed ends the point (the next round would meet the same fault), and so does the deadline."""
    t0 = time.perf_counter()
    results: list[RequestResult] = []
    per_round: list[float] = []
    cut = ""
    with ThreadPoolExecutor(concurrency) as pool:
        for k in range(rounds):
            if time.monotonic() >= deadline:
                cut = f"the run's deadline passed after {k} of {rounds} rounds"
                break
            seeds = [request_seed(context, concurrency, k, i) for i in range(concurrency)]
            futures = [pool.submit(one_request, ep, context, output_len, vocab, seed, deadline) for seed in seeds]
            batch = []
            for f in futures:
                batch.append(f.result())
                if progress is not None:
                    progress.update(1)
            results += [r for r in batch if r.sent]
            rate = _round_decode(batch)
            if rate is not None:
                per_round.append(rate)
            if time.monotonic() >= deadline and k + 1 < rounds:
                cut = f"the run's deadline passed during round {k + 1} of {rounds}"
                break
            if not any(r.ok for r in batch):
                cut = f"every request of round {k + 1} of {rounds} failed" if k + 1 < rounds else ""
                break
    wall = time.perf_counter() - t0
    if not cut and any(r.cut for r in results):
        cut = f"the run's deadline cut off {sum(r.cut for r in results)} request(s)"
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
        unreachable=bool(results) and all(r.unreachable for r in results),
        cut_short=cut,
    )


def compare(points: list[Point], previous: dict) -> dict[tuple[int, int], float]:
    """(context, concurrency) -> decode tok/s now / before, where both runs have the point."""
    before = {(p["context"], p["concurrency"]): p.get("decode_tok_s") for p in previous.get("points", [])}
    return {(p.context, p.concurrency): p.decode_tok_s / before[(p.context, p.concurrency)]
            for p in points if p.decode_tok_s and before.get((p.context, p.concurrency))}


def _who(run: BenchRun) -> str:
    """Release, model, endpoint and date of a run, for titles."""
    release = {"--release": f"release {run.release}", "/server_info version": f"SGLang build {run.release} (from "
               "/server_info; no --release given)"}.get(run.release_from or "", "release unknown")
    return (f"{release} · model {run.model or 'unknown'} · {run.endpoint} · {run.date[:16].replace('T', ' ')} "
            f"(UTC{run.date[19:] or '?'})")


def markdown(run: BenchRun, ratios: dict) -> str:
    def num(x: float | None, spec: str = ".1f", suffix: str = "") -> str:
        return "—" if x is None else f"{x:{spec}}{suffix}"

    def trio(d: dict, spec: str) -> str:
        return " / ".join(f"{d[q]:{spec}}" for q in ("p50", "p90", "p99")) if d else "—"

    def spread(p: Point) -> str:
        r = p.decode_tok_s_rounds
        return f"{num(p.decode_tok_s)} ({min(r):.1f}–{max(r):.1f}, {len(r)} rounds)" if r else "—"

    lines = [
        f"Throughput of {run.endpoint}: {_who(run)}; {run.output_len} output tokens a request, up to {run.rounds} "
        "rounds a point. Decode tok/s is the median of the rounds (lowest–highest round); times in ms "
        "(p50 / p90 / p99 over every request).",
        "",
        "| context | concurrency | ok | decode tok/s | output tok/s | TTFT | TPOT | ITL | accept length "
        "| vs previous |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in run.points:
        lines.append(
            f"| {p.context} | {p.concurrency} | {p.ok}/{p.requests} | {spread(p)} "
            f"| {num(p.output_throughput)} | {trio(p.ttft_ms, '.1f')} | {trio(p.tpot_ms, '.2f')} "
            f"| {trio(p.itl_ms, '.2f')} | {num(p.accept_length, '.2f')} "
            f"| {num(ratios.get((p.context, p.concurrency)), '.2f', '×')} |"
        )
    if run.stopped:
        lines += ["", f"Stopped early: {run.stopped}."]
    return "\n".join(lines) + "\n"


def context_label(n: int) -> str:
    """A context as its tick reads: 8192 -> 8k, 131072 -> 128k, 185000 -> 185k, 300 -> 300."""
    if n >= 1024 and n % 1024 == 0:
        return f"{n // 1024}k"
    if n >= 1000 and n % 1000 == 0:
        return f"{n // 1000}k"
    return f"{n:,}"


MARKERS = ("o", "s", "^", "D", "v", "P")
LINESTYLES = ("-", "--", ":", "-.")
SIDEWAYS = 1.1  # neighbouring series are drawn this factor apart in context, so their markers and bars do not cover


def _padded(lo: float, hi: float, frac: float = 0.15, least: float = 0.05) -> tuple[float, float]:
    """Axis limits zoomed to the data with `frac` of its span free above and below, so no point sits on the frame;
    the span is at least `least` of the largest value, so noise of a few hundredths does not fill the axis."""
    span = max(hi - lo, least * abs(hi)) or 1.0
    mid = (lo + hi) / 2
    return mid - (0.5 + frac) * span, mid + (0.5 + frac) * span


def title(run: BenchRun) -> str:
    """The plot's title: what is plotted, then release, model, endpoint and date."""
    return (f"ddtree-ops bench: decode tok/s, its spread across rounds and TPOT against context length "
            f"({run.output_len} output tokens a request, up to {run.rounds} rounds a point)\n{_who(run)}")


def figure(run: BenchRun):
    """The plot of a run as a matplotlib Figure: decode tok/s (median, round range), the rounds relative to their
    median, and TPOT p50, each against context on a log axis ticked at the measured contexts. None if no point
    was measured."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedFormatter, FixedLocator, NullLocator

    measured = [p for p in run.points if p.decode_tok_s]
    if not measured:
        return None
    levels = sorted({p.concurrency for p in measured})
    contexts = sorted({p.context for p in measured})
    fig, (a, s, b) = plt.subplots(1, 3, figsize=(16, 5.2))
    for k, c in enumerate(levels):
        pts = sorted((p for p in measured if p.concurrency == c), key=lambda p: p.context)
        shift = SIDEWAYS ** (k - (len(levels) - 1) / 2)
        xs = [p.context * shift for p in pts]
        style = {"marker": MARKERS[k % len(MARKERS)], "linestyle": LINESTYLES[k % len(LINESTYLES)],
                 "color": f"C{k}", "markersize": 6, "gid": f"concurrency {c}"}
        med = [p.decode_tok_s for p in pts]
        lo = [m - min(p.decode_tok_s_rounds) for m, p in zip(med, pts, strict=True)]
        hi = [max(p.decode_tok_s_rounds) - m for m, p in zip(med, pts, strict=True)]
        a.errorbar(xs, med, yerr=[lo, hi], capsize=4, label=f"concurrency {c}", **style)
        for x, p in zip(xs, pts, strict=True):
            rel = [(r / p.decode_tok_s - 1) * 100 for r in p.decode_tok_s_rounds]
            s.plot([x, x], [min(rel), max(rel)], color=style["color"], linestyle=style["linestyle"], linewidth=1.5)
            s.plot([x] * len(rel), rel, marker=style["marker"], color=style["color"], linestyle="none",
                   markersize=5, gid=style["gid"], label=f"concurrency {c}" if p is pts[0] else None)
        tp = [(x, p.tpot_ms["p50"]) for x, p in zip(xs, pts, strict=True) if p.tpot_ms]
        b.plot([x for x, _ in tp], [y for _, y in tp], label=f"concurrency {c}", **style)
    a.set_ylim(*_padded(min(min(p.decode_tok_s_rounds) for p in measured),
                        max(max(p.decode_tok_s_rounds) for p in measured)))
    a.set(ylabel="decode tok/s a request (1 / TPOT)",
          title="median of the rounds, bars: lowest–highest round\n(axis zoomed to the data, not from 0)")
    widest = max((abs(r / p.decode_tok_s - 1) * 100 for p in measured for r in p.decode_tok_s_rounds), default=0.0)
    s.axhline(0, color="0.5", linewidth=0.8)
    s.set_ylim(-max(widest, 0.5) * 1.3, max(widest, 0.5) * 1.3)
    s.set(ylabel="each round vs the point's median (%)", title="spread across rounds")
    tpots = [p.tpot_ms["p50"] for p in measured if p.tpot_ms]
    if tpots:
        b.set_ylim(*_padded(min(tpots), max(tpots)))
    b.set(ylabel="TPOT p50 (ms)", title="time per output token (p50 over every request)")
    x_lo, x_hi = contexts[0] / SIDEWAYS ** len(levels) / 1.25, contexts[-1] * SIDEWAYS ** len(levels) * 1.25
    for ax in (a, s, b):
        ax.set_xscale("log")
        ax.set_xlim(x_lo, x_hi)
        ax.xaxis.set_major_locator(FixedLocator(contexts))
        ax.xaxis.set_major_formatter(FixedFormatter([context_label(x) for x in contexts]))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlabel("context (prompt tokens), ticks at the measured contexts")
        ax.ticklabel_format(axis="y", useOffset=False)  # 20.01, not 0.01 and "+2e1" above the axis
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(title(run), fontsize="medium")
    fig.text(0.995, 0.005, f"series drawn {(SIDEWAYS - 1) * 100:.0f}% apart sideways so they do not cover each "
             "other" + (f"; stopped early: {run.stopped}" if run.stopped else ""), ha="right", va="bottom",
             fontsize="x-small", color="0.35", wrap=True)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return fig


def plot(run: BenchRun, path: Path) -> bool:
    """Write the run's plot to `path`; False (and a line saying why) when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:  # hosts get ddtree-ops without it; the JSON and markdown carry the numbers
        print(f"no plot written to {path}: install ddtree-ops[plot] (matplotlib) for it", file=sys.stderr)
        return False
    import matplotlib.pyplot as plt

    fig = figure(run)
    if fig is None:
        return False
    fig.savefig(path, dpi=110, metadata={"Title": title(run), "Software": "ddtree-ops bench"})
    plt.close(fig)
    return True


def _facts(ep: Endpoint, deadline: float) -> tuple[str | None, str | None, str]:
    """(served model, SGLang version, why a lookup got no answer) as the endpoint reports them, None where it does
    not; each lookup is bounded by 10 s and the deadline, and a lookup that gets no answer at all ends them."""
    found: dict[str, str | None] = {"model": None, "version": None}
    lookups = [("model", "/v1/models", lambda d: d["data"][0]["id"]),
               ("version", "/server_info", lambda d: d["version"]),
               ("version", "/get_server_info", lambda d: d["version"])]
    for key, path, read in lookups:
        left = deadline - time.monotonic()
        if found[key] is not None or left <= 0:
            continue
        try:
            found[key] = str(read(ep.get_json(path, timeout=min(ep.timeout, 10.0, left))))
        except (EndpointTimeout, EndpointUnreachable) as exc:
            return found["model"], found["version"], str(exc)
        except (EndpointError, KeyError, IndexError, TypeError, ValueError):
            continue
    return found["model"], found["version"], ""


def _not_run(pending: list[tuple[int, int]]) -> str:
    if not pending:
        return "nothing left to run"
    return (f"not run: {len(pending)} point(s) (context {', '.join(sorted({str(L) for L, _ in pending}, key=int))}"
            f" at concurrency {', '.join(sorted({str(c) for _, c in pending}, key=int))})")


def run_throughput(ep: Endpoint, *, contexts: list[int], concurrency: list[int], output_len: int = 256,
                   rounds: int = 3, vocab: int = 32000, out: str | Path = "throughput",
                   previous: str | Path | None = None, deadline_s: float = DEFAULT_DEADLINE_S,
                   release: str | None = None) -> BenchRun:
    """Measure every (context, concurrency) point in order, until the first point in which every request failed
    or `deadline_s` seconds after the start; write throughput.json after every point, then the table and the
    plot of what was measured."""
    from tqdm import tqdm

    deadline = time.monotonic() + deadline_s
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    prev = json.loads(Path(previous).read_text()) if previous else {}
    date = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    model, version, unanswered = _facts(ep, deadline)
    run = BenchRun(ep.url, model, release or version, "--release" if release else "/server_info version" if version
                   else None, date, output_len, rounds, list(contexts), list(concurrency), deadline_s, ep.timeout)
    record = out / "throughput.json"
    run.files.append(str(record))
    record.write_text(run.to_json())
    plan = [(L, c) for L in contexts for c in concurrency]
    with tqdm(total=sum(c * rounds for _, c in plan), desc="requests", unit="req") as bar:
        for n, (L, c) in enumerate(plan):
            if time.monotonic() >= deadline:
                waited = f" (the last wait: {unanswered})" if n == 0 and unanswered else ""
                run.stopped = (f"the run's deadline ({deadline_s:g} s, --deadline) passed after {len(run.points)} of "
                               f"{len(plan)} points{waited}; {_not_run(plan[n:])}")
                break
            bar.set_postfix(context=L, concurrency=c)
            p = measure_point(ep, L, c, output_len, vocab, rounds, bar, deadline)
            if p.requests:
                run.points.append(p)
            if p.cut_short.startswith("the run's deadline"):
                run.stopped = (f"the run's deadline ({deadline_s:g} s, --deadline) passed during context {L} "
                               f"concurrency {c} ({p.ok} of {p.requests} request(s) sent there finished); "
                               f"{sum(q.ok > 0 for q in run.points)} of {len(plan)} points measured; "
                               f"{_not_run(plan[n + 1:])}")
            elif p.ok == 0:
                run.stopped = (f"every request of context {L} concurrency {c} failed ({p.requests} sent, each {L} "
                               f"prompt tokens for {output_len} output tokens; the first: "
                               f"{p.errors[0] if p.errors else 'no error recorded'}); {_not_run(plan[n + 1:])}")
            record.write_text(run.to_json())
            if run.stopped:
                break
    if any(p.ok for p in run.points):  # nothing measured: no table or plot of empty points
        table = out / "throughput.md"
        table.write_text(markdown(run, compare(run.points, prev)))
        run.files.append(str(table))
        if plot(run, out / "throughput.png"):
            run.files.append(str(out / "throughput.png"))
    record.write_text(run.to_json())
    return run
