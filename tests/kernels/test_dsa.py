"""DSA tree verify against the float64 reference: the selected keys, and the output.

CPU (interpreter) at small sizes with a small top-k, so prefixes fall on both sides of it; on a GPU also GLM-5's
top 2,048 over realistic prefixes (`make test-gpu`)."""

from __future__ import annotations

import pytest
import torch

from ddtree_kernels.dsa import DSAWorkspace, boundary_gap, dsa_tree_verify, plan_dsa_verify, run_dsa_verify

from .cases import DEVICE, TARGET
from .dsa_cases import make_dsa_case

GPU = DEVICE == "cuda"


def _selected(ws: DSAWorkspace, t: int) -> set[int]:
    count = int(ws.sel_count[t])
    return set(ws.sel[t, :count].cpu().tolist())


def _check(case, out, ws=None, tol=2e-2):
    ref, selections = case.reference()
    if ws is not None:
        for t, sel in enumerate(selections):
            got = _selected(ws, t)
            assert int(ws.sel_count[t]) == sel.slots.numel(), f"token {t} seed={case.seed}"
            # the set is the reference's wherever the boundary logits do not tie within fp32 rounding
            if boundary_gap(sel.logits, case.topk) > 1e-4 * sel.logits[torch.isfinite(sel.logits)].abs().max():
                assert got == set(sel.slots.tolist()), f"token {t} seed={case.seed}"
    got = out.double().cpu()
    assert torch.isfinite(got).all(), f"unwritten rows seed={case.seed}"
    err = ((got - ref).norm() / ref.norm()).item()
    assert err < tol, f"relative error {err:.3e} seed={case.seed}"


def _run(case, heads):
    bs = case.qo_indptr.shape[0] - 1
    n = int((case.qo_indptr[1:] - case.qo_indptr[:-1]).max())
    plan = plan_dsa_verify(bs, heads, n, case.q.shape[0], case.max_context, TARGET, topk=case.topk,
                           kv_fp8=case.k_buf.dtype == torch.float8_e4m3fn)
    ws = DSAWorkspace(plan, DEVICE)
    out = torch.full((case.q.shape[0], heads, 512), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    run_dsa_verify(plan, ws, *case.args, out, sm_scale=case.sm_scale, k_scale=case.k_scale)
    return out, ws


@pytest.mark.parametrize(("prefixes", "drafts", "heads", "topk"), [
    ([300], [9], 8, 64),  # GLM-5's tree shape, prefix longer than the top-k
    ([40, 0, 700], [5, 3, 9], 8, 64),  # ragged: shorter than the top-k, empty, longer
    ([30], [9], 16, 64),  # every key visible: all of them attended
    ([0], [1], 8, 16),  # decode, empty prefix: the token sees itself only
    ([500], [1], 8, 32),  # decode
    ([200, 150], [4, 7], 20, 48),  # heads past one 16-row block
])
def test_dsa_matches_the_reference(prefixes, drafts, heads, topk):
    case = make_dsa_case(prefixes, drafts, heads, DEVICE, topk=topk)
    out, ws = _run(case, heads)
    _check(case, out, ws)


def test_dsa_fp8_cache():
    case = make_dsa_case([260, 90], [9, 4], 8, DEVICE, topk=64, kv_dtype=torch.float8_e4m3fn)
    out, ws = _run(case, 8)
    _check(case, out, ws, tol=6e-2)


def test_ancestors_stay_eligible_and_the_rest_of_the_tree_never():
    """A chain tree over a tiny prefix with top-k above the visible count: token i attends the prefix and tree
    tokens 0..i exactly, and never a later one."""
    case = make_dsa_case([5], [6], 8, DEVICE, topk=64, tree="chain")
    out, ws = _run(case, 8)
    tree = case.tree_slots.cpu().tolist()
    for i in range(6):
        got = _selected(ws, i)
        assert set(tree[: i + 1]) <= got and not set(tree[i + 1:]) & got
    _check(case, out, ws)


def test_the_standalone_call_plans_itself():
    case = make_dsa_case([120], [9], 8, DEVICE, topk=32)
    out = dsa_tree_verify(*case.args, sm_scale=case.sm_scale, topk=case.topk)
    _check(case, out)


def test_a_workspace_too_small_is_refused():
    plan = plan_dsa_verify(1, 8, 9, 9, 100, TARGET)
    ws = DSAWorkspace(plan, DEVICE)
    case = make_dsa_case([50], [9], 8, DEVICE, topk=2048)
    bigger = plan_dsa_verify(1, 8, 9, 9, 1000, TARGET)
    with pytest.raises(ValueError, match="DSAWorkspace"):
        run_dsa_verify(bigger, ws, *case.args, torch.empty(9, 8, 512, dtype=torch.bfloat16, device=DEVICE),
                       sm_scale=1 / 16)


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="GLM-5 sizes need a GPU")
@pytest.mark.parametrize(("prefixes", "drafts"), [([185_000], [9]), ([8192, 1500, 64_000, 0], [9, 9, 9, 9])])
def test_dsa_glm5_sizes(prefixes, drafts):
    case = make_dsa_case(prefixes, drafts, 8, DEVICE, topk=2048)
    out, ws = _run(case, 8)
    _check(case, out, ws)


def test_exact_ties_at_the_boundary_fill_the_top_k_once_each():
    """Every prefix key alike (one index key copied everywhere): all logits tie, so the threshold bin is the whole
    prefix. The top-k still holds exactly k distinct visible slots, every tree key that beats the tie among them."""
    case = make_dsa_case([200], [5], 8, DEVICE, topk=32, tree="chain")
    buf = case.index_buf
    prefix = case.kv_indices[:200].long()
    buf[prefix] = buf[prefix[0]].clone()
    _, ws = _run(case, 8)
    for t in range(5):
        got = ws.sel[t, : int(ws.sel_count[t])].cpu().tolist()
        assert int(ws.sel_count[t]) == 32 and len(set(got)) == 32
        assert set(got) <= set(prefix.cpu().tolist()) | set(case.tree_slots.cpu().tolist()[: t + 1])
