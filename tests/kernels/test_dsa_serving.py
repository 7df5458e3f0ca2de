"""A DSA model's TARGET_VERIFY as our backend serves it (ddtree_kernels.sglang.dsa_verify, patch 0007).

The pool is a stand-in holding a real page-size-1 index buffer (the layout SGLang's DSA pool keeps at page size 1,
held to it by tests/sglang_gpu on the real pool); the kernels run for real (GPU or interpreter) against the
float64 reference. What the indexer hands over is what the patched `Indexer.forward_cuda` passes: fp8 queries
[T, 32, 128] and head gates [T, 32, 1].
"""

from __future__ import annotations

import types

import pytest
import torch

from ddtree_kernels.sglang import dsa_verify
from ddtree_kernels.sglang.verify_stats import VerifyStats

from .cases import DEVICE, TARGET
from .dsa_cases import make_dsa_case

HEADS, TOPK = 8, 32


@pytest.fixture
def stats(monkeypatch):
    fresh = VerifyStats()
    monkeypatch.setattr(dsa_verify, "STATS", fresh)
    return fresh


class _Pool:
    """What DSAVerify reads of SGLang's DSA pool: the layer's index buffer."""

    page_size = 1

    def __init__(self, index_buf):
        self.index_buf = index_buf

    def get_index_k_with_scale_buffer(self, layer_id: int):
        return self.index_buf


def _verify(case, skip_layers=frozenset()) -> dsa_verify.DSAVerify:
    return dsa_verify.DSAVerify(_Pool(case.index_buf), heads=HEADS, topk=case.topk, index_heads=32,
                                max_context=case.max_context, width=9, target=TARGET, skip_layers=skip_layers)


def _batch(case, mode: str = "verify"):
    forward_mode = types.SimpleNamespace(is_target_verify=lambda: mode == "verify")
    return types.SimpleNamespace(forward_mode=forward_mode, out_cache_loc=case.tree_slots)


def _serve(verify, case, layer_id: int) -> torch.Tensor | None:
    out = torch.full((case.q.shape[0], HEADS, 512), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    n = int((case.qo_indptr[1:] - case.qo_indptr[:-1]).max())
    served = verify.run(layer_id, case.q, out, case.k_buf, case.kv_indptr, case.kv_indices, case.qo_indptr,
                        case.visibility.to(torch.uint8), n, case.sm_scale)
    return out if served else None


def _stage(verify, case, layer_id: int, mode: str = "verify") -> None:
    weights = case.index_weights[..., None]  # the indexer's [T, HI, 1]
    verify.indexer_metadata(_batch(case, mode)).ddtree_stage_index_query(layer_id, case.index_q, weights)


def _relative_error(out, want) -> float:
    return ((out.double().cpu() - want).norm() / want.norm()).item()


def test_a_staged_query_is_ranked_and_attended(stats):
    case = make_dsa_case([20, 70], [5, 9], HEADS, DEVICE, topk=TOPK)  # ragged, one prefix past the top-k
    verify = _verify(case)
    _stage(verify, case, layer_id=3)
    out = _serve(verify, case, layer_id=3)
    want, selections = case.reference()
    assert out is not None and _relative_error(out, want) < 2e-2
    assert max(s.slots.numel() for s in selections) == TOPK  # the selection mattered
    assert stats.served_dsa == 1 and stats.declined == {}
    assert verify.staged is None  # one layer's query serves that layer only


def test_a_prefill_stages_its_queries_and_an_unstaged_layer_is_declined(stats):
    case = make_dsa_case([100], [9], HEADS, DEVICE, topk=TOPK)
    verify = _verify(case)
    _stage(verify, case, layer_id=0, mode="extend")  # a prompt longer than the top k: the sparse prefill's queries
    assert verify.staged is not None and verify.staged.layer_id == 0
    verify.staged = None
    assert _serve(verify, case, layer_id=0) is None
    _stage(verify, case, layer_id=0)
    assert _serve(verify, case, layer_id=1) is None  # another layer's query is not this layer's
    assert stats.served_dsa == 0 and sum(stats.declined.values()) == 2
    assert all("no index query staged" in reason for reason in stats.declined)


def test_a_layer_that_skips_its_indexer_attends_the_last_selection(stats):
    """index_topk_freq / index_topk_pattern: a layer without an indexer reuses the previous layer's keys."""
    case = make_dsa_case([60], [5], HEADS, DEVICE, topk=TOPK)
    verify = _verify(case, skip_layers=frozenset({1}))
    verify.reserve(1, DEVICE)
    _stage(verify, case, layer_id=0)
    first = _serve(verify, case, layer_id=0)
    again = _serve(verify, case, layer_id=1)  # same queries and rows: the same output from the kept selection
    assert first is not None and again is not None and torch.equal(first, again)
    assert stats.served_dsa == 2


def test_an_fp8_pool_row_layout_is_declined_with_the_fix(stats):
    case = make_dsa_case([50], [9], HEADS, DEVICE, topk=TOPK)
    verify = _verify(case)
    _stage(verify, case, layer_id=0)
    case.k_buf = torch.zeros(case.k_buf.shape[0], 1, 656, dtype=torch.uint8, device=DEVICE)  # SGLang's fp8 DSA rows
    assert _serve(verify, case, layer_id=0) is None
    assert any("--kv-cache-dtype bfloat16" in reason for reason in stats.declined)


def test_one_reserved_workspace_fits_every_captured_batch_size():
    case = make_dsa_case([10], [9], HEADS, DEVICE, topk=TOPK)
    verify = _verify(case)
    verify.reserve(4, DEVICE)
    reserved = verify.workspace
    plans = [verify.plan(bs, n, bs * n) for bs in range(1, 5) for n in range(1, 10)]  # trees narrower than the width
    assert all(reserved.fits(plan) for plan in plans)
    assert reserved.o_part.shape[1] == max(plan.attention_splits for plan in plans)


def test_skipping_layers_reads_the_config():
    config = types.SimpleNamespace(num_hidden_layers=6, cli_factor=3)
    assert dsa_verify.skipping_layers(config) == frozenset({1, 2, 4, 5})
