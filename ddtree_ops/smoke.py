"""Smoke test of a live SGLang endpoint: what an operator (and the deploy playbook) runs after a deploy.

    ddtree-ops smoke --endpoint http://127.0.0.1:30000 --min-accept-length 1.5 [--json report.json]

Checks, in order: /health_generate answers 200; the model is listed; a deterministic chat
(temperature 0) is non-empty with consistent usage; a streamed chat sends a first chunk and
ends with [DONE]; a long prompt and a long output both complete (the first requests of a new
server may compile kernels); the speculative acceptance length is above the floor (per request
via return_spec_tokens_details, else /server_info or /get_server_info), since a broken drafter
changes no output, only speed; with --verify-stats DIR, that TARGET_VERIFY reached our kernel
at least once (the per-process counts ddtree_kernels writes there; a release whose verify always
falls back to SGLang's slow path fails, naming SGLang's reasons). Exit 1 with one line per failed
check.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .endpoint import Endpoint, EndpointError

PROMPT = "List the first five prime numbers, separated by commas."
LONG_PROMPT = " ".join(f"Sentence {i} of a long context that the model must read." for i in range(400))


@dataclass
class Check:
    name: str
    ok: bool
    reason: str = ""
    seconds: float = 0.0


@dataclass
class SmokeReport:
    endpoint: str
    model: str | None
    checks: list[Check] = field(default_factory=list)
    accept_length: float | None = None

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    def to_json(self) -> str:
        return json.dumps(asdict(self) | {"ok": self.ok}, indent=1)


class CheckFailed(AssertionError):
    """A smoke check's expectation did not hold; the message is its one-line reason."""


def _expect(cond: bool, reason: str) -> None:
    if not cond:
        raise CheckFailed(reason)


def _usage_consistent(usage: dict | None, max_tokens: int, where: str) -> dict:
    _expect(isinstance(usage, dict), f"{where}: no usage in the answer")
    p, c, t = usage.get("prompt_tokens"), usage.get("completion_tokens"), usage.get("total_tokens")
    _expect(isinstance(p, int) and p > 0, f"{where}: usage.prompt_tokens={p!r}, expected > 0")
    _expect(isinstance(c, int) and 0 < c <= max_tokens,
            f"{where}: usage.completion_tokens={c!r}, expected 1..{max_tokens}")
    _expect(t == p + c, f"{where}: usage.total_tokens={t} != prompt {p} + completion {c}")
    return usage


def read_verify_stats(folder: str | Path) -> dict:
    """The sum of the `verify-<pid>.json` counts ddtree_kernels wrote in `folder` (sglang/verify_stats.py)."""
    total = {"files": 0, "served": 0, "served_dsa": 0, "declined": {}}
    for path in sorted(Path(folder).glob("verify-*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # a file being replaced, or not ours
        total["files"] += 1
        total["served"] += int(data.get("served", 0))
        total["served_dsa"] += int(data.get("served_dsa", 0))
        for reason, count in (data.get("declined") or {}).items():
            total["declined"][reason] = total["declined"].get(reason, 0) + int(count)
    return total


def health_reason(where: str, status: int, body: str) -> str:
    """What a /health_generate answer other than 200 means. SGLang answers 503 with an empty body while it starts
    (and when its own health request fails); any other status is not a warm-up, and is named as it came, with the
    start of its body."""
    if status == 503:
        said = "" if body == "(empty body)" else f" ({body})"
        return f"{where} answered 503: still warming up, or unhealthy{said}"
    return (f"{where} answered HTTP {status}, not SGLang's warm-up answer (503): {body}; the server's log says why "
            "(`fab logs --host HOST` on a deployed host)")


def wait_healthy(ep: Endpoint, wait_s: float, poll_s: float = 2.0) -> tuple[int | None, str]:
    """Poll /health_generate until 200 or `wait_s` passes; (last status, what the last answer means)."""
    deadline = time.monotonic() + wait_s
    where = f"GET {ep.url}/health_generate"
    while True:
        try:
            status, body = ep.probe("/health_generate", timeout=min(ep.timeout, 60))
            reason = "" if status == 200 else health_reason(where, status, body)
        except EndpointError as exc:
            status, reason = None, str(exc)
        if status == 200 or time.monotonic() >= deadline:
            return status, reason
        time.sleep(poll_s)


def run_smoke(ep: Endpoint, *, model: str | None = None, min_accept_length: float | None = None,
              wait_s: float = 0.0, verify_stats: str | Path | None = None, expect_dsa: bool = False) -> SmokeReport:
    report = SmokeReport(ep.url, model)
    state: dict = {}

    def check(name: str, fn: Callable[[], None]) -> None:
        t0 = time.perf_counter()
        try:
            fn()
            report.checks.append(Check(name, True, seconds=time.perf_counter() - t0))
        except (CheckFailed, EndpointError) as exc:
            report.checks.append(Check(name, False, str(exc), time.perf_counter() - t0))

    def health():
        status, reason = wait_healthy(ep, wait_s)
        _expect(status == 200, reason + (f" (after waiting {wait_s:.0f} s)" if wait_s else ""))

    def listed():
        ids = [m.get("id") for m in ep.get_json("/v1/models").get("data", [])]
        _expect(bool(ids), f"GET {ep.url}/v1/models lists no model")
        if report.model is None:
            report.model = ids[0]
        _expect(report.model in ids, f"model {report.model!r} not served; /v1/models lists {ids}")

    def chat(messages, max_tokens: int, where: str, **extra) -> dict:
        body = {"model": report.model or "default", "messages": messages, "temperature": 0,
                "max_tokens": max_tokens, **extra}
        answer = ep.post_json("/v1/chat/completions", body)
        choices = answer.get("choices") or []
        _expect(bool(choices), f"{where}: answer has no choices")
        text = (choices[0].get("message") or {}).get("content") or ""
        _expect(bool(text.strip()), f"{where}: empty completion (finish_reason={choices[0].get('finish_reason')})")
        _usage_consistent(answer.get("usage"), max_tokens, where)
        return answer

    def deterministic_chat():
        chat([{"role": "user", "content": PROMPT}], 32, "chat (temperature 0)")

    def streamed_chat():
        body = {"model": report.model or "default", "messages": [{"role": "user", "content": PROMPT}],
                "temperature": 0, "max_tokens": 32, "stream": True, "stream_options": {"include_usage": True}}
        events = list(ep.stream("/v1/chat/completions", body))  # raises without [DONE]
        _expect(bool(events), "streamed chat: no chunk before [DONE]")
        text = "".join((c.get("delta") or {}).get("content") or "" for _, e in events for c in e.get("choices", []))
        _expect(bool(text.strip()), "streamed chat: chunks carry no content")
        usage = next((e["usage"] for _, e in reversed(events) if e.get("usage")), None)
        _usage_consistent(usage, 32, "streamed chat")

    def long_prompt():
        chat([{"role": "user", "content": LONG_PROMPT + "\nSummarise in one line."}], 16, "long prompt")

    def long_output():
        answer = chat([{"role": "user", "content": "Count upwards from 1, one number per line."}], 256,
                      "long output", ignore_eos=True, return_spec_tokens_details=True)
        details = (answer.get("sglext") or {}).get("spec_tokens_details")
        if isinstance(details, list):
            details = details[0] if details else None
        if details and details.get("spec_accept_length"):
            state["accept_length"] = float(details["spec_accept_length"])

    def acceptance():
        length = state.get("accept_length")
        source = "return_spec_tokens_details"
        if length is None:
            for path in ("/server_info", "/get_server_info"):
                try:
                    info = ep.get_json(path)
                except EndpointError:
                    continue
                states = info.get("internal_states") or [info]
                values = [s.get("avg_spec_accept_length") for s in states if s.get("avg_spec_accept_length")]
                if values:
                    length, source = float(values[0]), path
                    break
        _expect(length is not None, "no speculative acceptance length reported (request details and /server_info)"
                                    " — is speculative decoding on?")
        report.accept_length = length
        _expect(length >= min_accept_length, f"acceptance length {length:.2f} ({source}) is below the floor "
                                             f"{min_accept_length:.2f}: the drafter is not helping")

    def verify_served():
        stats = read_verify_stats(verify_stats)
        _expect(stats["files"] > 0, f"no verify statistics in {verify_stats}: the server wrote none (is "
                                    "DDTREE_VERIFY_STATS_DIR set there, and ddtree_kernels' verify hook patched in?)")
        declined = "; ".join(f"{reason} ({n}x)" for reason, n in sorted(stats["declined"].items()))
        _expect(stats["served"] > 0, f"TARGET_VERIFY never reached ddtree_kernels: every call fell back to SGLang's "
                                     f"extend_attention_fwd ({declined or 'no call recorded'})")
        if expect_dsa:  # a DSA checkpoint served sparse: every verify ranked and attended by the DSA path
            dsa_declined = {r: n for r, n in stats["declined"].items() if r.startswith("DSA")}
            _expect(stats["served_dsa"] > 0 and not dsa_declined,
                    f"the DSA model's TARGET_VERIFY was not served sparse: {stats['served_dsa']} served by the DSA "
                    f"tree verify, declined: {declined or 'none'} (is the ddtree-v2 series' patch 0007 applied?)")

    check("health_generate answers 200", health)
    if report.checks[-1].ok:
        check("model listed", listed)
        check("deterministic chat with consistent usage", deterministic_chat)
        check("streamed chat ends with [DONE]", streamed_chat)
        check("long prompt completes", long_prompt)
        check("long output completes", long_output)
        if min_accept_length is not None:
            check(f"speculative acceptance length >= {min_accept_length}", acceptance)
        if verify_stats is not None:
            check("TARGET_VERIFY served by ddtree_kernels" + (" (sparse DSA)" if expect_dsa else ""), verify_served)
    return report


def print_report(report: SmokeReport) -> None:
    for c in report.checks:
        print(f"{'PASS' if c.ok else 'FAIL'}  {c.name}" + (f": {c.reason}" if c.reason else f" ({c.seconds:.2f} s)"))
    verdict = "all checks passed" if report.ok else f"{sum(not c.ok for c in report.checks)} check(s) failed"
    print(f"smoke {report.endpoint} (model {report.model}): {verdict}"
          + (f", acceptance length {report.accept_length:.2f}" if report.accept_length else ""))
