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


def test_rounds_give_a_median_and_its_spread(standin, tmp_path):
    """Three rounds of two requests at once (the CLI's default of rounds): one median 1/TPOT a round, the point's
    figure is their median, the table shows the range; the plot's title names the endpoint's served model."""
    from ddtree_ops.throughput import _served_model

    url = standin(tokens_per_s=100.0)
    (point,) = run_throughput(Endpoint(url, timeout=30), contexts=[256], concurrency=[2], output_len=21, rounds=3,
                              out=tmp_path)
    assert point.requests == point.ok == 6 and len(point.decode_tok_s_rounds) == 3
    assert min(point.decode_tok_s_rounds) <= point.decode_tok_s <= max(point.decode_tok_s_rounds)
    assert point.decode_tok_s == pytest.approx(100, rel=0.15)
    row = next(line for line in (tmp_path / "throughput.md").read_text().splitlines() if line.startswith("| 256 |"))
    assert f"{min(point.decode_tok_s_rounds):.1f}–{max(point.decode_tok_s_rounds):.1f}, 3 rounds" in row
    assert _served_model(Endpoint(url, timeout=10)) == Endpoint(url, timeout=10).get_json("/v1/models")["data"][0]["id"]


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
    assert not (tmp_path / "throughput.png").exists()  # every request failed: no empty plot


@pytest.mark.parametrize(("args", "named"), [
    (["--contexts", "8k"], "--contexts: '8k' is not a whole number"),
    (["--concurrency", "0"], "--concurrency: 0 must be at least 1"),
    (["--previous", "/no/such/throughput.json"], "--previous: no file"),
    (["--endpoint", "not-a-url"], "--endpoint: 'not-a-url' is not an http(s) URL"),
])
def test_bad_arguments_get_one_line_naming_the_problem(args, named, capsys):
    from ddtree_ops.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["bench", *args])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and named in err.strip().splitlines()[-1] and "Traceback" not in err


def test_a_closed_port_stops_at_the_first_point_without_a_plot(tmp_path, capsys):
    import socket

    from ddtree_ops.cli import main

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc = main(["bench", "--endpoint", f"http://127.0.0.1:{port}", "--contexts", "64,128,256", "--concurrency", "1",
               "--out", str(tmp_path), "--timeout", "5"])
    err = capsys.readouterr().err
    assert rc == 1 and "every request failed (stopped after the first point" in err and "no table or plot" in err
    assert len(json.loads((tmp_path / "throughput.json").read_text())["points"]) == 1  # stopped after the first
    assert not (tmp_path / "throughput.png").exists()


def test_every_option_shows_its_default(capsys):
    from ddtree_ops.cli import main

    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    out = capsys.readouterr().out
    for default in ("8192,32768,65536,131072,185000", "(default: 1,4)", "(default: 256)", "(default: 3)"):
        assert default in " ".join(out.split()), default


def test_a_port_that_does_not_speak_http_is_named(tmp_path, capsys):
    """Something else on the port (here a banner, as sshd sends): the failure says the answer was not HTTP."""
    import socket
    import threading

    from ddtree_ops.cli import main

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def answer() -> None:
        for _ in range(4):
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")

    threading.Thread(target=answer, daemon=True).start()
    try:
        rc = main(["bench", "--endpoint", f"http://127.0.0.1:{server.getsockname()[1]}", "--contexts", "64",
                   "--concurrency", "1", "--rounds", "1", "--out", str(tmp_path), "--timeout", "5"])
    finally:
        server.close()
    assert rc == 1 and "not in HTTP" in capsys.readouterr().err
