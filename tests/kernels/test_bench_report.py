"""What one run of the benchmark writes: bench.json, bench.md, bench.png and bench.log (the whole
progress, kept where only the end of stdout survives), one line a case.

The GPU parts (the two ceilings and each case's measurement) need CUDA and are replaced here by
fixed numbers; `make bench-kernels` runs them for real. This checks the report built from them.
"""

from __future__ import annotations

import json
from dataclasses import asdict

from ddtree_tools import bench


def test_a_run_writes_every_report_with_each_case(tmp_path, monkeypatch):
    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench.torch.cuda, "get_device_name", lambda *args: "stand-in GPU")
    monkeypatch.setattr(bench.torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(bench, "ceilings", lambda device: (4000.0, 700.0))
    monkeypatch.setattr(bench, "measure", lambda case, device, copy, mm, sgl, target, table=None: bench.Row(
        case=asdict(case), floor_us=10.0, ours_us=21.0, ours_graph_us=20.0, sglang_extend_us=2000.0,
        err_vs_sglang=1e-3, err_vs_reference=2e-3))

    assert bench.main(["--quick", "--out", str(tmp_path)]) == 0

    log = (tmp_path / "bench.log").read_text()
    lines = log.splitlines()
    assert lines[0] == "stand-in GPU: copy 4000 GB/s, matmul 700 TFLOP/s"
    progress = [line for line in lines if line.startswith("[")]
    assert [line.split()[0] for line in progress] == ["[1/3]", "[2/3]", "[3/3]"]
    assert all("ours     20.0 µs" in line and "50% of floor 10.0" in line for line in progress)
    assert (tmp_path / "bench.md").read_text().strip() in log  # the table ends the log
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    assert [bench.Case(**r["case"]) for r in rows] == bench.QUICK
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
