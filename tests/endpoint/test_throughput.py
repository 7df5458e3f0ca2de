"""Throughput metrics against what the stand-in was told to produce; faults keep partial results."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ddtree_ops.endpoint import Endpoint
from ddtree_ops.throughput import run_throughput

# Paces are slow (10 ms a token) so that scheduling jitter on a busy 2-core CI machine stays
# small against the intervals measured.


def test_metrics_match_the_configured_server(standin, tmp_path):
    url = standin(tokens_per_s=100.0, accept_length=4, ttft_s=0.05)
    points = run_throughput(Endpoint(url, timeout=30), contexts=[512, 2048], concurrency=[1, 3], output_len=41,
                            rounds=1, out=tmp_path)
    assert [(p.context, p.concurrency) for p in points] == [(512, 1), (512, 3), (2048, 1), (2048, 3)]
    for p in points:
        assert p.ok == p.requests == p.concurrency
        assert p.decode_tok_s == pytest.approx(100, rel=0.15)  # 1 / TPOT
        assert p.tpot_ms["p50"] == pytest.approx(10, rel=0.15)
        assert 50 <= p.ttft_ms["p50"] < 150  # the configured 50 ms plus transport of the prompt
        assert p.itl_ms["p50"] == pytest.approx(40, rel=0.15)  # one verify step of 4 tokens per chunk
        assert p.accept_length == pytest.approx(41 / 10)
    data = json.loads((tmp_path / "throughput.json").read_text())
    assert len(data["points"]) == 4
    assert "| 2048 | 3 | 3/3 |" in (tmp_path / "throughput.md").read_text()
    assert (tmp_path / "throughput.png").stat().st_size > 10_000


def test_comparison_with_a_previous_run(standin, tmp_path):
    slow = run_throughput(Endpoint(standin(tokens_per_s=50.0), timeout=30), contexts=[256], concurrency=[1],
                          output_len=21, rounds=1, out=tmp_path / "before")
    assert slow[0].decode_tok_s == pytest.approx(50, rel=0.15)
    run_throughput(Endpoint(standin(tokens_per_s=100.0), timeout=30), contexts=[256], concurrency=[1],
                   output_len=21, rounds=1, out=tmp_path / "after", previous=tmp_path / "before" / "throughput.json")
    row = next(line for line in (tmp_path / "after" / "throughput.md").read_text().splitlines()
               if line.startswith("| 256 |"))
    ratio = float(row.rstrip(" |").split("|")[-1].strip().rstrip("×"))
    assert ratio == pytest.approx(2.0, rel=0.2)


def test_broken_streams_are_reported_and_partial_results_kept(standin, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "ddtree_ops", "bench", "--endpoint", standin(stream_fault="no_done"),
         "--contexts", "128,256", "--concurrency", "1", "--rounds", "1", "--output-len", "9", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "context 128 concurrency 1: 1 request(s) failed" in proc.stderr and "without [DONE]" in proc.stderr
    points = json.loads((tmp_path / "throughput.json").read_text())["points"]
    assert [p["ok"] for p in points] == [0, 0] and "without [DONE]" in points[0]["errors"][0]
