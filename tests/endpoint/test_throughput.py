"""Throughput metrics against what the stand-in was told to produce; faults keep partial results."""

from __future__ import annotations

import datetime
import json
import re
import subprocess
import sys
import threading

import pytest

from ddtree_ops.endpoint import Endpoint
from ddtree_ops.throughput import run_throughput

# Paces are slow (10 ms a token) so that scheduling jitter on a busy 2-core CI machine stays
# small against the intervals measured.


def test_metrics_match_the_configured_server(standin, tmp_path):
    url = standin(tokens_per_s=100.0, accept_length=4, ttft_s=0.05)
    run = run_throughput(Endpoint(url, timeout=30), contexts=[512, 2048], concurrency=[1, 3], output_len=41,
                         rounds=1, out=tmp_path, release="20261206-0712-ab12cd3")
    points = run.points
    assert [(p.context, p.concurrency) for p in points] == [(512, 1), (512, 3), (2048, 1), (2048, 3)]
    for p in points:
        assert p.ok == p.requests == p.concurrency
        assert p.decode_tok_s == pytest.approx(100, rel=0.15)  # 1 / TPOT
        assert p.tpot_ms["p50"] == pytest.approx(10, rel=0.15)
        assert 50 <= p.ttft_ms["p50"] < 150  # the configured 50 ms plus transport of the prompt
        assert p.itl_ms["p50"] == pytest.approx(40, rel=0.15)  # one verify step of 4 tokens per chunk
        assert p.accept_length == pytest.approx(41 / 10)
    data = json.loads((tmp_path / "throughput.json").read_text())
    assert len(data["points"]) == 4 and data["stopped"] is None
    # what was measured, against what and when, in the record itself
    assert data["endpoint"] == url and data["model"] == "glm-5" and data["output_len"] == 41 and data["rounds"] == 1
    assert data["release"] == "20261206-0712-ab12cd3" and data["release_from"] == "--release"
    assert datetime.datetime.fromisoformat(data["date"]).tzinfo is not None
    table = (tmp_path / "throughput.md").read_text()
    assert "| 2048 | 3 | 3/3 |" in table and "20261206-0712-ab12cd3" in table
    tpot = next(line for line in table.splitlines() if line.startswith("| 2048 | 3 |")).split("|")[7]
    assert re.fullmatch(r" \d+\.\d\d / \d+\.\d\d / \d+\.\d\d ", tpot), tpot  # not rounded to whole ms
    png = tmp_path / "throughput.png"
    assert png.stat().st_size > 10_000 and [str(png)] == run.files[2:]
    from PIL import Image

    title = Image.open(png).info["Title"]
    assert "20261206-0712-ab12cd3" in title and data["date"][:10] in title and "decode tok/s" in title


def test_rounds_give_a_median_and_its_spread(standin, tmp_path):
    """Three rounds of two requests at once (the CLI's default of rounds): one median 1/TPOT a round, the point's
    figure is their median, the table shows the range; the plot's title names the endpoint's served model."""
    url = standin(tokens_per_s=100.0)
    run = run_throughput(Endpoint(url, timeout=30), contexts=[256], concurrency=[2], output_len=21, rounds=3,
                         out=tmp_path)
    (point,) = run.points
    assert point.requests == point.ok == 6 and len(point.decode_tok_s_rounds) == 3
    assert min(point.decode_tok_s_rounds) <= point.decode_tok_s <= max(point.decode_tok_s_rounds)
    assert point.decode_tok_s == pytest.approx(100, rel=0.15)
    row = next(line for line in (tmp_path / "throughput.md").read_text().splitlines() if line.startswith("| 256 |"))
    assert f"{min(point.decode_tok_s_rounds):.1f}–{max(point.decode_tok_s_rounds):.1f}, 3 rounds" in row
    assert run.model == Endpoint(url, timeout=10).get_json("/v1/models")["data"][0]["id"]
    # no --release: the SGLang build the server reports, said to be that
    assert run.release == "0.5.23" and run.release_from == "/server_info version"


def test_comparison_with_a_previous_run(standin, tmp_path):
    slow = run_throughput(Endpoint(standin(tokens_per_s=50.0), timeout=30), contexts=[256], concurrency=[1],
                          output_len=21, rounds=1, out=tmp_path / "before").points
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
    assert "context 128 concurrency 1: 1 of 1 request(s) failed" in proc.stderr and "without [DONE]" in proc.stderr
    points = json.loads((tmp_path / "throughput.json").read_text())["points"]
    assert [p["ok"] for p in points] == [0] and "without [DONE]" in points[0]["errors"][0]  # stopped there
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
    assert rc == 1 and "every request of context 64 concurrency 1 failed" in err and "no table or plot" in err
    assert "connection refused" in err and "not run: 2 point(s) (context 128, 256 at concurrency 1)" in err
    assert len(json.loads((tmp_path / "throughput.json").read_text())["points"]) == 1  # stopped after the first
    assert not (tmp_path / "throughput.png").exists()


def test_every_option_shows_its_default(capsys):
    from ddtree_ops.cli import main

    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    out = capsys.readouterr().out
    for default in ("8192,32768,65536,131072,185000", "(default: 1,4)", "(default: 256)", "(default: 3)",
                    "--deadline DEADLINE seconds for the whole run", "(default: 1800.0)"):
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


@pytest.mark.parametrize(("fault", "named"), [("http_500", "HTTP 500 Internal Server Error"),
                                              ("html", "not a server-sent event: '<!DOCTYPE html>")],
                         ids=["http-500", "html-page"])
def test_a_point_where_every_request_failed_ends_the_run(fault, named, tmp_path, capsys):
    """An endpoint that answers every request wrong gets one round of the first point, not all 5 contexts x 2
    concurrencies x 3 rounds of ever longer prompts; the run says why it stopped, what it sent and what it left."""
    from ddtree_ops.cli import main

    from .standin_server import Behaviour, StandInServer

    server = StandInServer(Behaviour(fault=fault))
    with server as url:
        rc = main(["bench", "--endpoint", url, "--contexts", "64,128,256", "--concurrency", "2,4",
                   "--out", str(tmp_path), "--timeout", "30"])
    err = capsys.readouterr().err
    sent = [path for method, path in server.requests if method == "POST"]
    assert sent == ["/generate"] * 2  # one round of the first point (2 at once): at most its 3 x 2 requests
    assert rc == 1 and named in err
    assert "stopped early: every request of context 64 concurrency 2 failed (2 sent, each 64 prompt tokens" in err
    assert "not run: 5 point(s) (context 64, 128, 256 at concurrency 2, 4)" in err
    data = json.loads((tmp_path / "throughput.json").read_text())
    assert len(data["points"]) == 1 and data["stopped"].startswith("every request of context 64 concurrency 2 failed")
    assert f"wrote {(tmp_path / 'throughput.json').resolve()}" in err and not (tmp_path / "throughput.png").exists()


@pytest.mark.parametrize("fault", ["hang", "hang_generate"])
def test_the_deadline_ends_a_run_against_a_server_that_never_answers(fault, tmp_path, capsys):
    """A server that accepts and never answers (everything, or only /generate): the run's deadline, not the
    per-request timeout (600 s, the default), ends it; it writes its record and says so."""
    from ddtree_ops.cli import main

    from .standin_server import Behaviour, StandInServer

    result = {}
    with StandInServer(Behaviour(fault=fault)) as url:
        def bench() -> None:
            result["rc"] = main(["bench", "--endpoint", url, "--contexts", "64,128", "--concurrency", "1,4",
                                 "--out", str(tmp_path), "--deadline", "2"])

        worker = threading.Thread(target=bench, daemon=True)
        worker.start()
        worker.join(300)  # a guard only: the run ends at its 2 s deadline; without one it would wait 600 s a request
        assert not worker.is_alive(), "the run outlived its deadline"
    err = capsys.readouterr().err
    assert result["rc"] == 1 and "stopped early: the run's deadline (2 s, --deadline) passed" in err
    data = json.loads((tmp_path / "throughput.json").read_text())
    assert data["deadline_s"] == 2 and data["stopped"].startswith("the run's deadline (2 s, --deadline) passed")
    assert all(p["ok"] == 0 for p in data["points"]) and "not run: " in data["stopped"]
    assert f"wrote {(tmp_path / 'throughput.json').resolve()}" in err


def _run(points, **kw):
    from ddtree_ops.throughput import BenchRun

    return BenchRun(**{"endpoint": "http://127.0.0.1:30000", "model": "glm-5", "release": "20261206-0712-ab12cd3",
                       "release_from": "--release", "date": "2026-12-06T07:35:02+00:00", "output_len": 256,
                       "rounds": 3, "contexts": sorted({p.context for p in points}),
                       "concurrency": sorted({p.concurrency for p in points}), "deadline_s": 1800.0,
                       "timeout_s": 600.0, "points": points} | kw)


def _point(context, concurrency, rounds):
    from ddtree_ops.throughput import Point

    med = sorted(rounds)[len(rounds) // 2]
    tpot = {"p50": 1e3 / med, "p90": 1e3 / min(rounds), "p99": 1e3 / min(rounds)}
    return Point(context, concurrency, 3 * concurrency, 3 * concurrency, 10.0, med * concurrency, med, rounds,
                 {"p50": 300.0, "p90": 310.0, "p99": 320.0}, tpot, tpot, 3.2)


def test_the_plot_shows_what_it_claims():
    """The figure itself: ticks at exactly the measured contexts, every point and bar inside its axes with room to
    spare, the spread across rounds on an axis zoomed to it, concurrency 1 and 4 told apart by marker, line and
    position, and a title naming the release, the date and what is plotted."""
    import matplotlib.pyplot as plt

    from ddtree_ops.throughput import figure

    rates = {8192: 175.0, 32768: 150.0, 65536: 130.0, 131072: 100.0, 185000: 78.0}
    points = [_point(L, c, [r * f * (1 - 0.03 * (c == 4)) for f in (0.99, 1.0, 1.012)])
              for L, r in rates.items() for c in (1, 4)]
    fig = figure(_run(points))
    fig.canvas.draw()
    decode, spread, tpot = fig.axes
    for ax in fig.axes:
        assert list(ax.get_xticks()) == list(rates) and not ax.xaxis.get_minorticklocs().size
        assert [t.get_text() for t in ax.get_xticklabels()] == ["8k", "32k", "64k", "128k", "185k"]
        (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
        for line in (ln for ln in ax.lines if ln.get_transform() == ax.transData):  # not the 0% rule across
            for x, y in zip(line.get_xdata(), line.get_ydata(), strict=True):
                assert x0 < x < x1 and y0 + 0.05 * (y1 - y0) < y < y1 - 0.05 * (y1 - y0), (ax.get_ylabel(), x, y)
        first = {}
        for line in ax.lines:
            first.setdefault(line.get_gid(), line)
        one, four = first["concurrency 1"], first["concurrency 4"]
        assert one.get_marker() != four.get_marker() and one.get_xdata()[0] != four.get_xdata()[0]
        if ax is not spread:
            assert one.get_linestyle() != four.get_linestyle()
    assert decode.get_ylim()[0] > 0.5 * min(rates.values())  # zoomed to the data, not a 0-based axis
    assert spread.get_ylim()[1] < 3 * 1.2  # the rounds' spread (-1% to +1.2%) fills the axis
    assert "TPOT" in tpot.get_ylabel()
    title = fig._suptitle.get_text()
    assert "release 20261206-0712-ab12cd3" in title and "2026-12-06" in title and "decode tok/s" in title
    plt.close(fig)
