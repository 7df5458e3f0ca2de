"""The run report (report.py, breakdown.py) on runs and traces built the way e2e.py and torch's profiler write
them (Chrome trace events), and the DFLASH launch e2e.py derives from the production one."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from ddtree_ops.throughput import prompt_ids, request_seed
from tests.server_gpu.breakdown import breakdown
from tests.server_gpu.e2e import bench_prompt, chain_args, run_name

PID, TID = 1, 7
STEP = "sglang/srt/speculative/{}_worker_v2.py(900): forward_batch_generation"


def _py(name: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": "python_function", "name": name, "pid": PID, "tid": TID, "ts": ts, "dur": dur}


def _launch(name: str, ts: float, corr: int, dur: float = 5.0) -> dict:
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": PID, "tid": TID, "ts": ts, "dur": dur,
            "args": {"correlation": corr}}


def _gpu(cat: str, name: str, ts: float, dur: float, corr: int) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 0, "ts": ts, "dur": dur,
            "args": {"correlation": corr}}


def _trace(tmp_path: Path, worker: str, steps: int) -> Path:
    """`steps` decode steps of 1000 us: a drafter kernel, the target's graph replay (attention + MLP), and
    one copy of the accept lengths to the host that waits 300 us."""
    events, corr = [], 0
    for i in range(steps):
        t = 10_000.0 * i
        events.append(_py(STEP.format(worker), t, 1000))
        events.append(_py("sglang/srt/model_executor/model_runner.py(10): forward", t + 10, 100))
        corr += 1
        events += [_launch("cudaLaunchKernel", t + 20, corr), _gpu("kernel", "draft_gemm", t + 30, 50, corr)]
        events.append(_py("sglang/srt/managers/tp_worker.py(5): forward_batch_generation", t + 200, 300))
        corr += 1
        events += [_launch("cudaGraphLaunch", t + 210, corr),
                   _gpu("kernel", "tree_block_attention", t + 220, 100, corr),
                   _gpu("kernel", "mlp_gemm", t + 320, 200, corr)]
        events.append(_py("sglang/srt/speculative/dflash_utils.py(3): accept_lens_host", t + 600, 350))
        corr += 1
        events += [_launch("cudaMemcpyAsync", t + 610, corr, dur=300),
                   _gpu("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", t + 900, 2, corr)]
        events.append(_py("sglang/srt/managers/scheduler.py(1): event_loop_overlap", t + 2000, 10))
    path = tmp_path / "trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    return path


@pytest.mark.parametrize("worker", ["ddtree", "dflash"])
def test_parts_gpu_busy_and_host_waits_per_step(tmp_path, worker):
    got = breakdown(_trace(tmp_path, worker, steps=3))
    assert got["steps"] == 3
    parts = got["parts_ms"]
    assert parts["drafter (rest of the model)"] == pytest.approx(0.050)
    assert parts["target verify attention"] == pytest.approx(0.100)
    assert parts["target verify (rest of the model)"] == pytest.approx(0.200)
    assert got["gpu_busy_ms"] == pytest.approx(0.352)
    syncs = got["host_syncs"]
    assert syncs["per_step"] == 1 and syncs["wait_ms_per_step"] == pytest.approx(0.3)
    assert list(syncs["by_caller"]) == ["dflash_utils.py: accept_lens_host"]


def test_a_copy_to_the_device_is_not_a_wait(tmp_path):
    path = _trace(tmp_path, "ddtree", steps=2)
    with gzip.open(path, "rt") as f:
        data = json.load(f)
    for e in data["traceEvents"]:
        if e["name"].startswith("Memcpy DtoH"):
            e["name"] = "Memcpy HtoD (Pinned -> Device)"
    with gzip.open(path, "wt") as f:
        json.dump(data, f)
    assert breakdown(path)["host_syncs"]["per_step"] == 0


def _rename_kernel(path: Path, old: str, new: str) -> Path:
    with gzip.open(path, "rt") as f:
        data = json.load(f)
    for e in data["traceEvents"]:
        if e["name"] == old:
            e["name"] = new
    with gzip.open(path, "wt") as f:
        json.dump(data, f)
    return path


def test_a_dsa_targets_key_selection_is_its_own_part(tmp_path):
    """Our DSA top-k inside the target's graph is the indexer's share; the sparse attention is attention."""
    path = _rename_kernel(_trace(tmp_path, "ddtree", steps=2), "tree_block_attention", "dsa_topk_kernel")
    parts = breakdown(path)["parts_ms"]
    assert parts["target verify indexer and top-k"] == pytest.approx(0.100)
    assert "target verify attention" not in parts
    _rename_kernel(path, "dsa_topk_kernel", "dsa_sparse_mla_kernel")
    assert breakdown(path)["parts_ms"]["target verify attention"] == pytest.approx(0.100)


ARGV = ["--model-path", "m", "--speculative-algorithm", "DDTREE", "--speculative-ddtree-budget", "8",
        "--page-size", "1", "--speculative-draft-model-path", "d", "--speculative-ddtree-cuda-graph-buckets", "4", "9"]


def test_the_chain_launch_is_the_production_one_without_the_tree():
    got = chain_args(ARGV)
    assert got == ["--model-path", "m", "--speculative-algorithm", "DFLASH", "--page-size", "1",
                   "--speculative-draft-model-path", "d"]
    assert run_name("ddtree", "DDTREE") == "ddtree" and run_name("ddtree", "DFLASH") == "ddtree-dflash"


def test_the_token_and_profile_stages_send_the_bench_prompt():
    """So their prefill hits the prefix the bench left in the cache (a 78-layer 185k prefill takes minutes)."""
    for context in (8192, 65536):
        assert bench_prompt(context) == prompt_ids(context, 32000, request_seed(context, 1, 0, 0))


GPU = "NVIDIA H200 (sm_90), torch 2.11.0+cu130, Triton 3.6.0"


def _run_dir(root: Path, runs: dict[str, dict], stand_in: dict, trace_of: dict[str, Path], gpu: str | None = GPU
             ) -> Path:
    """What e2e.py --pack returns: runs.tar.gz (summary.json, <run>/result.json, bench, tokens) and traces."""
    import shutil
    import tarfile

    staging = root / "staging"
    for name, run in runs.items():
        (staging / name / "bench").mkdir(parents=True)
        (staging / name / "result.json").write_text(json.dumps(run["result"]))
        (staging / name / "tokens.json").write_text(json.dumps(run["tokens"]))
        (staging / name / "bench" / "throughput.json").write_text(json.dumps({"points": run["points"]}))
    (staging / "summary.json").write_text(json.dumps({"stand_in": stand_in} | ({"gpu": gpu} if gpu else {})))
    out = root / "out"
    out.mkdir()
    with tarfile.open(out / "runs.tar.gz", "w:gz") as tf:
        for p in staging.iterdir():
            tf.add(p, arcname=p.name)
    for name, trace in trace_of.items():
        shutil.copy(trace, out / f"trace-{name}-8192.json.gz")
    return out


def _point(context: int, tpot: float) -> dict:
    return {"context": context, "decode_tok_s": 1000 / tpot, "tpot_ms": {"p50": tpot}, "accept_length": 1.0}


def test_the_report_joins_calls_and_holds_the_tree_to_the_chain(tmp_path):
    from tests.server_gpu.report import markdown, report

    glm5 = {"name": "glm5-weight", "layers": 78, "mlp_width": 648}
    for sub in ("t1", "t2"):
        (tmp_path / sub).mkdir()
    tree, chain = _trace(tmp_path / "t1", "ddtree", steps=2), _trace(tmp_path / "t2", "dflash", steps=2)
    first = _run_dir(tmp_path / "call1", {"ddtree": {
        "result": {"kernel": "ddtree", "algorithm": "DDTREE", "argv": ["--speculative-algorithm", "DDTREE"],
                   "verify_stats": [{"served": 5, "declined": {}}]},
        "tokens": {"8192": [1, 2, 3]}, "points": [_point(8192, 0.704)]}}, glm5, {"ddtree": tree})
    second = _run_dir(tmp_path / "call2", {"ddtree-dflash": {
        "result": {"kernel": "ddtree", "algorithm": "DFLASH", "argv": ["--speculative-algorithm", "DFLASH"],
                   "verify_stats": [{"served": 7, "declined": {"x": 1}}]},
        "tokens": {"8192": [1, 2, 3]}, "points": [_point(8192, 0.5)]}}, glm5, {"ddtree-dflash": chain})
    data = report(first, second, commit="abc")
    assert data["layers"] == 78 and data["stand_in"] == "glm5-weight"
    assert data["same_tokens_reference"] == "ddtree-dflash" and data["same_tokens"] is True
    assert (data["verify_served"], data["verify_declined"]) == (12, 1)
    by = {r["algorithm"]: r for r in data["rows"]}
    assert by["DDTREE"]["gpu_busy_ms"] == pytest.approx(0.352)
    assert by["DDTREE"]["step_over_gpu_busy"] == pytest.approx(0.704 / 0.352)
    assert by["DFLASH"]["host_syncs"]["per_step"] == 1
    table = markdown(data)
    assert "our kernel, DFlash chain" in table and "2.00×" in table
    assert "same_tokens_as_before" not in data


def test_tokens_are_held_to_the_run_before_a_change(tmp_path):
    from tests.server_gpu.report import plot, report

    glm5 = {"name": "glm5-weight", "layers": 78}

    def call(name: str, tokens: list[int]) -> Path:
        return _run_dir(tmp_path / name, {"ddtree": {"result": {"kernel": "ddtree", "argv": []},
                                                     "tokens": {"8192": tokens, "65536": [4]},
                                                     "points": [_point(8192, 0.5)]}}, glm5, {})

    before, after = call("before", [1, 2, 3]), call("after", [1, 2, 9])
    data = report(after, commit="abc", before=(before,))
    assert data["same_tokens_as_before"] == {"8192": {"tokens": 3, "first_difference": 2},
                                             "65536": {"tokens": 1, "first_difference": None}}
    assert [(r["context"], r["step_ms"]) for r in data["before_rows"]] == [(8192, 0.5)]
    plot(data, tmp_path / "plot.png")  # the before line drawn beside the run's
    assert (tmp_path / "plot.png").stat().st_size > 0


def test_a_run_continued_in_a_later_call_adds_its_contexts(tmp_path):
    from tests.server_gpu.report import report

    trace = _trace(tmp_path, "ddtree", steps=2)
    glm5 = {"name": "glm5-weight", "layers": 78}

    def call(name: str, points: list[dict], tokens: dict, served: int, traced: bool) -> Path:
        return _run_dir(tmp_path / name, {"ddtree": {
            "result": {"kernel": "ddtree", "argv": [], "verify_stats": [{"served": served, "declined": {}}]},
            "tokens": tokens, "points": points}}, glm5, {"ddtree": trace} if traced else {})

    first = call("call1", [_point(8192, 0.704), _point(65536, 0.9)], {"8192": [1, 2]}, 5, traced=True)
    second = call("call2", [_point(65536, 0.8), _point(185000, 1.2)], {"185000": [3]}, 7, traced=False)
    data = report(first, second, commit="abc")
    assert [(r["context"], r["step_ms"]) for r in data["rows"]] == [(8192, 0.704), (65536, 0.8), (185000, 1.2)]
    assert data["rows"][0]["gpu_busy_ms"] == pytest.approx(0.352)  # the first call's profile kept
    assert data["verify_served"] == 12


def test_calls_that_served_different_stand_ins_are_refused(tmp_path):
    from tests.server_gpu.report import report

    run = {"ddtree": {"result": {"kernel": "ddtree", "argv": []}, "tokens": {}, "points": []}}
    a = _run_dir(tmp_path / "a", run, {"name": "small", "layers": 8}, {})
    b = _run_dir(tmp_path / "b", run, {"name": "glm5-weight", "layers": 78}, {})
    with pytest.raises(ValueError, match="different stand-ins"):
        report(a, b, commit="abc")


def test_a_dsa_run_is_reported_beside_the_dense_view(tmp_path):
    from tests.server_gpu.report import markdown, report

    small = {"name": "small", "layers": 8}
    dsa = _run_dir(tmp_path / "dsa", {"ddtree-dsa": {
        "result": {"kernel": "ddtree", "algorithm": "DDTREE", "attention": "dsa", "argv": ["--page-size", "1"],
                   "verify_stats": [{"served": 9, "served_dsa": 8, "declined": {}}]},
        "tokens": {"8192": [1, 2]}, "points": [_point(8192, 0.6)]}}, small, {})
    dense = _run_dir(tmp_path / "dense", {"ddtree": {
        "result": {"kernel": "ddtree", "algorithm": "DDTREE", "argv": []},
        "tokens": {"8192": [1, 3]}, "points": [_point(8192, 0.5)]}}, small, {})
    data = report(dsa, commit="abc", dense=(dense,))
    assert (data["attention"], data["reference"]) == ("dsa", "sglang-dsa")
    assert data["same_tokens"] is None  # SGLang's own DSA serving did not run: nothing to hold the tokens to
    assert (data["verify_served"], data["verify_served_dsa"]) == (9, 8)
    assert [r["attention"] for r in data["rows"]] == ["dsa"]
    assert [(r["attention"], r["step_ms"]) for r in data["dense_view_rows"]] == [("dense-view", 0.5)]
    assert "0.60" in markdown(data)
    assert report(dense, commit="abc")["attention"] == "dense-view" and "reference" not in report(dense, commit="abc")


def test_the_card_is_the_one_the_runs_recorded(tmp_path):
    from tests.server_gpu.report import report

    run = {"ddtree": {"result": {"kernel": "ddtree", "argv": []}, "tokens": {}, "points": [_point(8192, 0.5)]}}
    small = {"name": "small", "layers": 8}
    h100 = "NVIDIA H100 80GB HBM3 (sm_90), torch 2.11.0+cu130, Triton 3.6.0"
    assert report(_run_dir(tmp_path / "a", run, small, {}, gpu=h100), commit="abc")["gpu"] == h100
    with pytest.raises(ValueError, match="different cards"):
        report(_run_dir(tmp_path / "b", run, small, {}), _run_dir(tmp_path / "c", run, small, {}, gpu=h100),
               commit="abc")
    older = _run_dir(tmp_path / "d", run, small, {}, gpu=None)
    with pytest.raises(ValueError, match="pass --gpu"):
        report(older, commit="abc")
    assert report(older, commit="abc", gpu=h100)["gpu"] == h100
    with pytest.raises(ValueError, match="contradicts"):
        report(_run_dir(tmp_path / "e", run, small, {}), commit="abc", gpu=h100)


def test_budgets_are_runs_of_their_own_held_to_the_target(tmp_path):
    """A budget sweep on the trained pair: each DDTREE budget is its own run (`ddtree-b<N>`, the production budget
    `ddtree`), rows say which budget, and every speculative run's tokens are held to the target served without
    speculation (`target`)."""
    from tests.server_gpu.e2e import run_name
    from tests.server_gpu.report import report

    assert run_name("ddtree", "DDTREE", budget=16) == "ddtree-b16"
    assert run_name("ddtree", "DDTREE", "dsa", budget=4) == "ddtree-b4-dsa"
    assert run_name("ddtree", "DFLASH", budget=16) == "ddtree-dflash"  # a chain has no node budget
    trained = {"name": "trained", "layers": 6}

    def spec(algorithm: str, budget: int | None, tokens: list[int], accept: float) -> dict:
        point = _point(8192, 2.0) | {"accept_length": accept}
        return {"result": {"kernel": "ddtree", "algorithm": algorithm, "budget": budget, "argv": []},
                "tokens": {"8192": tokens}, "points": [point]}

    runs = {"ddtree": spec("DDTREE", 8, [1, 2, 3], 4.0), "ddtree-b16": spec("DDTREE", 16, [1, 2, 3], 5.0),
            "ddtree-dflash": spec("DFLASH", None, [1, 2, 7], 3.0),
            "target": {"result": {"kernel": "sglang", "algorithm": "none", "argv": []}, "tokens": {"8192": [1, 2, 3]},
                       "points": []}}
    data = report(_run_dir(tmp_path / "call", runs, trained, {}), commit="abc")
    assert data["same_tokens_reference"] == "target" and data["same_tokens"] is True
    assert {(r["run"], r["budget"], r["accept_length"]) for r in data["rows"]} == {
        ("ddtree", 8, 4.0), ("ddtree-b16", 16, 5.0), ("ddtree-dflash", None, 3.0)}
    by_run = data["same_tokens_by_run"]
    assert by_run["ddtree-b16"]["8192"]["first_difference"] is None
    assert by_run["ddtree-dflash"]["8192"]["first_difference"] == 2 and "target" not in by_run
    assert "same_tokens_as_training" not in data  # a pair trained before train.json recorded its own tokens


def test_the_served_pair_is_held_to_its_own_training_forward(tmp_path):
    """train.json's greedy tokens after the serve prompt (the PyTorch forward that was trained) against our DDTREE
    server's: a served model that is not the trained one parts at once."""
    from tests.server_gpu.report import report

    trained = {"name": "trained", "layers": 6, "training": {"greedy_after_serve_prompt": {"8192": [5, 6, 7, 8]}}}
    for tokens, first in (([5, 6, 7, 8], None), ([5, 6, 9, 8], 2)):
        run = {"ddtree": {"result": {"kernel": "ddtree", "algorithm": "DDTREE", "budget": 8, "argv": []},
                          "tokens": {"8192": tokens, "65536": [1]}, "points": [_point(8192, 2.0)]}}
        data = report(_run_dir(tmp_path / f"call-{first}", run, trained, {}), commit="abc")
        assert data["same_tokens_as_training"] == {"8192": {"tokens": 4, "first_difference": first}}


def test_the_production_budget_and_the_chain_run_before_the_other_budgets():
    from tests.server_gpu.e2e import plan_runs

    first, later = plan_runs(["ddtree"], ["DDTREE", "DFLASH"], [4, 8, 16], production=8)
    assert first == [("ddtree", "DDTREE", None), ("ddtree", "DFLASH", None)]
    assert later == [("ddtree", "DDTREE", 4), ("ddtree", "DDTREE", 16)]
    assert plan_runs(["ddtree"], ["DDTREE"], [4, 16], production=8) == ([], [("ddtree", "DDTREE", 4),
                                                                            ("ddtree", "DDTREE", 16)])
    assert plan_runs(["ddtree", "sglang"], ["DDTREE"], None, 8)[0] == [("ddtree", "DDTREE", None),
                                                                       ("sglang", "DDTREE", None)]
