"""Fallbacks are loud: the verify hook logs each declined shape once and counts every call, and the
smoke test's reader (ddtree_ops.smoke.read_verify_stats) reads what it writes, and what the test
hosts' stand-in server writes in its place."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from ddtree_kernels.sglang import adapter as sglang_adapter
from ddtree_kernels.sglang import sglang_verify_fwd
from ddtree_kernels.sglang.verify_stats import STATS_DIR_ENV, VerifyStats
from ddtree_ops.smoke import read_verify_stats

from .cases import DEVICE, TARGET, make_case


@pytest.fixture
def stats(monkeypatch, tmp_path):
    fresh = VerifyStats()
    monkeypatch.setattr(sglang_adapter, "STATS", fresh)
    monkeypatch.setenv(STATS_DIR_ENV, str(tmp_path))
    return fresh


def _call(case, **kwargs) -> bool:
    out = torch.zeros(case.q.shape[0], case.q.shape[1], 512, dtype=case.q.dtype, device=case.q.device)
    return sglang_verify_fwd(case.q, case.k_draft, case.v_draft, out, case.k_cache, case.v_cache,
                                case.qo_indptr, case.kv_indptr, case.kv_indices, case.custom_mask, True,
                                case.mask_indptr, case.max_draft, 1.0, 1.0, case.sm_scale, **kwargs, target=TARGET)


def test_served_and_declined_calls_are_counted_and_read_back(stats, tmp_path, caplog):
    case = make_case([40], [5], 4, DEVICE)
    assert _call(case) is True
    with caplog.at_level(logging.WARNING, logger="ddtree_kernels"):
        for _ in range(3):
            assert _call(case, sinks=torch.zeros(4, device=DEVICE)) is False
    warnings = [r.getMessage() for r in caplog.records if "handed back" in r.getMessage()]
    assert len(warnings) == 1 and "attention sinks" in warnings[0] and "4 heads" in warnings[0]

    files = list(tmp_path.glob("verify-*.json"))
    assert len(files) == 1  # written on each new shape: the repeats wait for the next write
    data = json.loads(files[0].read_text())
    assert data["served"] == 1 and data["declined"] == {"attention sinks": 1}
    assert [s["outcome"] for s in data["shapes"]] == ["served", "declined"]
    stats.write()
    assert read_verify_stats(tmp_path) == {"files": 1, "served": 1, "served_dsa": 0, "declined": {"attention sinks": 3}}


def test_no_folder_no_file(monkeypatch, tmp_path):
    monkeypatch.delenv(STATS_DIR_ENV, raising=False)
    stats = VerifyStats()
    stats.record(None, (8, 576, 512, "bfloat16", "bfloat16", True))
    assert stats.served == 1 and stats.write() is None


def test_standin_server_writes_the_same_layout(stats, tmp_path, monkeypatch):
    """The deploy tests' stand-in server writes these files in the kernel's place: same keys, same reader."""
    from tests.endpoint.standin_server import _write_verify_stats

    stats.record("sliding-window attention", (8, 576, 512, "bfloat16", "bfloat16", True))
    real = json.loads(stats.write().read_text())
    standin_dir = tmp_path / "standin"
    _write_verify_stats({STATS_DIR_ENV: str(standin_dir), "STANDIN_VERIFY": "declined:attention sinks"})
    (written,) = standin_dir.glob("verify-*.json")
    standin = json.loads(written.read_text())
    assert set(standin) == set(real)
    assert {tuple(s) for s in standin["shapes"]} == {tuple(s) for s in real["shapes"]}
    assert read_verify_stats(standin_dir)["declined"] == {"attention sinks": 78}
    assert read_verify_stats(standin_dir)["served"] == 0


def test_a_dsa_checkpoint_is_counted_as_the_dsa_verify_counts_it(stats, tmp_path):
    """The stand-in counts a DSA checkpoint's verifies as served by the DSA tree verify, as the real hook does."""
    from tests.endpoint.standin_server import _write_verify_stats

    stats.record(None, (8, 576, 512, "bfloat16", "bfloat16", "dsa"))
    real = json.loads(stats.write().read_text())
    model = tmp_path / "GLM-5"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["GlmMoeDsaForCausalLM"], "index_topk": 2048}))
    standin_dir = tmp_path / "standin"
    _write_verify_stats({STATS_DIR_ENV: str(standin_dir)}, str(model))
    standin = json.loads(next(standin_dir.glob("verify-*.json")).read_text())
    assert real["served_dsa"] == 1 and standin["served_dsa"] > 0
    assert {tuple(s) for s in standin["shapes"]} == {tuple(s) for s in real["shapes"]}
