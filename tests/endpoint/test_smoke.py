"""Every smoke check passes against a healthy stand-in, and each fails when the server misbehaves that way."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ddtree_ops.endpoint import Endpoint
from ddtree_ops.smoke import run_smoke


def failed(report) -> dict[str, str]:
    return {c.name: c.reason for c in report.checks if not c.ok}


def test_healthy_server_passes_every_check(standin):
    report = run_smoke(Endpoint(standin(), timeout=10), min_accept_length=1.5)
    assert report.ok and len(report.checks) == 7 and report.model == "glm-5"
    assert report.accept_length == pytest.approx(4.0)


@pytest.mark.parametrize(
    "behaviour, check, reason",
    [
        ({"never_healthy": True}, "health_generate answers 200", "503"),
        ({"empty_completion": True}, "deterministic chat with consistent usage", "empty completion"),
        ({"wrong_usage": True}, "deterministic chat with consistent usage", "total_tokens"),
        ({"stream_fault": "no_done"}, "streamed chat ends with [DONE]", "without [DONE]"),
        ({"stream_fault": "bad_json"}, "streamed chat ends with [DONE]", "not JSON"),
        ({"accept_length": 1}, "speculative acceptance length >= 1.5", "below the floor"),
    ],
    ids=["503-forever", "empty", "wrong-usage", "no-done", "bad-json", "low-acceptance"],
)
def test_each_misbehaviour_fails_its_check(standin, behaviour, check, reason):
    report = run_smoke(Endpoint(standin(**behaviour), timeout=10), min_accept_length=1.5)
    assert not report.ok
    assert check in failed(report), failed(report)
    assert reason in failed(report)[check]


def test_slow_tokens_time_out_with_a_clear_reason(standin):
    report = run_smoke(Endpoint(standin(tokens_per_s=40), timeout=1.5))
    reasons = failed(report)
    assert "long output completes" in reasons and "no answer within 2 s" in reasons["long output completes"]
    assert "/v1/chat/completions" in reasons["long output completes"]


def test_warm_up_is_waited_for(standin):
    url = standin(warmup_s=1.5)
    assert not run_smoke(Endpoint(url, timeout=5)).ok  # 503 while warming up
    assert run_smoke(Endpoint(url, timeout=5), wait_s=10).ok


def test_acceptance_from_server_info_on_older_releases(standin):
    url = standin(report_spec_details=False, server_info_path="/get_server_info", accept_length=3)
    report = run_smoke(Endpoint(url, timeout=10), min_accept_length=2.5)
    assert report.ok and report.accept_length == 3.0


def test_no_server_is_one_line_not_a_traceback(tmp_path):
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "ddtree_ops", "smoke", "--endpoint", "http://127.0.0.1:9",
                           "--json", str(out)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr + proc.stdout
    line = "FAIL  health_generate answers 200: GET http://127.0.0.1:9/health_generate: connection refused"
    assert line in proc.stdout
    assert json.loads(out.read_text())["ok"] is False


def test_cli_passes_on_a_healthy_server(standin, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "ddtree_ops", "smoke", "--endpoint", standin(),
                           "--min-accept-length", "2", "--json", str(tmp_path / "r.json")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all checks passed" in proc.stdout


def test_api_key_is_sent_and_required(standin):
    url = standin(api_key="s3cret")
    assert run_smoke(Endpoint(url, "s3cret", timeout=10), min_accept_length=1.5).ok
    refused = run_smoke(Endpoint(url, None, timeout=10), min_accept_length=1.5)
    assert not refused.ok and "401" in " ".join(failed(refused).values()), failed(refused)


def _stats(folder, served: int, declined: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "verify-101.json").write_text(json.dumps({"pid": 101, "served": served, "declined": declined,
                                                         "shapes": [], "updated": 0.0}))


@pytest.mark.parametrize(
    "served, declined, reason",
    [
        (None, None, "no verify statistics"),
        (0, {"sliding-window attention": 12}, "never reached ddtree_kernels: every call fell back"),
    ],
    ids=["no-statistics", "all-declined"],
)
def test_verify_that_never_reached_the_kernel_fails(standin, tmp_path, served, declined, reason):
    if served is not None:
        _stats(tmp_path, served, declined)
    report = run_smoke(Endpoint(standin(), timeout=10), verify_stats=tmp_path)
    check = failed(report)["TARGET_VERIFY served by ddtree_kernels"]
    assert reason in check and (declined is None or "sliding-window attention (12x)" in check)


def test_verify_served_passes(standin, tmp_path):
    _stats(tmp_path, 78, {"attention sinks": 2})  # some fallbacks, but the kernel serves the verify
    report = run_smoke(Endpoint(standin(), timeout=10), verify_stats=tmp_path)
    assert report.ok and report.checks[-1].name == "TARGET_VERIFY served by ddtree_kernels"


@pytest.mark.parametrize(
    "served_dsa, declined, ok",
    [(78, {}, True), (0, {}, False), (70, {"DSA: no index query staged for layer 3 (SGLang's indexer did not run)": 8},
                                      False)],
    ids=["sparse", "dense-only", "some-layers-dense"],
)
def test_a_dsa_checkpoint_needs_every_verify_served_sparse(standin, tmp_path, served_dsa, declined, ok):
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "verify-7.json").write_text(json.dumps({"pid": 7, "served": 78, "served_dsa": served_dsa,
                                                        "declined": declined, "shapes": [], "updated": 0.0}))
    report = run_smoke(Endpoint(standin(), timeout=10), verify_stats=tmp_path, expect_dsa=True)
    name = "TARGET_VERIFY served by ddtree_kernels (sparse DSA)"
    assert report.ok is ok and report.checks[-1].name == name
    if not ok:
        assert "not served sparse" in failed(report)[name] and "patch 0007" in failed(report)[name]


@pytest.mark.parametrize(
    "behaviour, said, not_said",
    [
        ({"fault": "http_500"}, "answered HTTP 500, not SGLang's warm-up answer (503): Internal Server Error", "503:"),
        ({"never_healthy": True}, "answered 503: still warming up, or unhealthy", "HTTP 500"),
    ],
    ids=["500", "503"],
)
def test_health_names_the_status_that_came(standin, behaviour, said, not_said):
    """A 500 is reported as the 500 it is, with its body and where the cause is; only SGLang's 503 is a warm-up."""
    reason = failed(run_smoke(Endpoint(standin(**behaviour), timeout=10)))["health_generate answers 200"]
    assert said in reason and not_said not in reason and "warming up" not in reason.replace(said, "")
    assert ("fab logs" in reason) == ("500" in said)
