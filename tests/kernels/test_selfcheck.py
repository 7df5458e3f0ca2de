"""The deploy's kernel self-check: passes on a correct kernel, fails (with the numbers) on a wrong one."""

from __future__ import annotations

import json

import pytest
import torch

from ddtree_kernels.sglang import selfcheck


@pytest.mark.parametrize("kv_dtype", ["bfloat16", "fp8_e4m3"])
def test_the_self_check_passes_and_reports_each_case(kv_dtype, capsys):
    assert selfcheck.main(["--heads", "8", "--draft", "9", "--kv-cache-dtype", kv_dtype, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and [c["name"] for c in report["cases"]] == ["served shape", "ragged requests", "decode"]
    assert all(0 < c["rel_error"] <= c["tolerance"] for c in report["cases"])
    # it names what it ran: the target planned for and each kernel launched (tree, prefix tile(s), merge)
    assert report["target"] and report["kernels"][0] == "tree" and report["kernels"][-1] == "merge"


def test_a_wrong_kernel_fails_the_self_check(monkeypatch, capsys):
    def wrong(q, k, v, out, *args, **kwargs):  # a kernel that drops the prefix: the tree block's answer only
        out.copy_(v[:, :1].expand_as(out) if v.shape[-1] == out.shape[-1] else torch.zeros_like(out))
        return True

    monkeypatch.setattr(selfcheck, "sglang_verify_fwd", wrong)
    assert selfcheck.main(["--heads", "8", "--draft", "9"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  served shape" in out and "relative error" in out and "FAILED" in out
    assert "verify plan: bs 1, 8 heads x 9 draft tokens" in out  # the target and kernels it ran
