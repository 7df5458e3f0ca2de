"""DSA tree verify against the float64 reference: the selected keys, and the output.

CPU (interpreter) at small sizes with a small top-k, so prefixes fall on both sides of it; on a GPU also GLM-5's
top 2,048 over realistic prefixes (`make test-gpu`)."""

from __future__ import annotations

import pytest
import torch

from ddtree_kernels.dsa import DSAWorkspace, boundary_gap, dsa_tree_verify, plan_dsa_verify, run_dsa_verify
from ddtree_kernels.dsa.index_keys import index_views

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


def _run(case, heads, *, max_context=None, candidates=None):
    """(out, the workspace; None where the plan took the dense shortcut and selected nothing). max_context: plan for
    a longer context than the case's (a server's plan: no dense shortcut, the take-all decided on the GPU)."""
    bs = case.qo_indptr.shape[0] - 1
    n = int((case.qo_indptr[1:] - case.qo_indptr[:-1]).max())
    plan = plan_dsa_verify(bs, heads, n, case.q.shape[0], max_context or case.max_context, TARGET, topk=case.topk,
                           kv_fp8=case.k_buf.dtype == torch.float8_e4m3fn, candidates=candidates)
    ws = DSAWorkspace(plan, DEVICE)
    out = torch.full((case.q.shape[0], heads, 512), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    run_dsa_verify(plan, ws, *case.args, out, sm_scale=case.sm_scale, k_scale=case.k_scale)
    return out, (None if plan.dense_shortcut else ws)


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
    out, ws = _run(case, 8, max_context=1000)  # no dense shortcut: the take-all is the GPU's decision
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
    plan = plan_dsa_verify(1, 8, 9, 9, 100, TARGET, topk=64)
    ws = DSAWorkspace(plan, DEVICE)
    case = make_dsa_case([50], [9], 8, DEVICE, topk=64)
    bigger = plan_dsa_verify(1, 8, 9, 9, 1000, TARGET, topk=64)
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


def _boundary_counts(ws, tokens: int, topk: int) -> list[int]:
    """Keys in each token's boundary bucket, from the histogram the top-k left in the workspace."""
    hist = ws.state[:tokens, :256].cpu()
    counts = []
    for t in range(tokens):
        above = torch.cumsum(hist[t].flip(0), 0)
        first = int(torch.nonzero(above >= topk)[0])
        counts.append(int(hist[t].flip(0)[first]))
    return counts


@pytest.mark.parametrize("candidates", [None, 32])
def test_near_equal_logits_in_the_boundary_bucket(candidates):
    """Every prefix key the same fp8 key with a scale 0.05% apart from the next: the logits differ in order but all
    fall in one bucket, so the boundary bucket holds the whole prefix. With the default buffer the candidates are
    resolved from it; with 32 entries it overflows and the resolve program selects from the row. Either way the
    selected set is the float64 reference's (sglang #36807 returned wrong sets when its buffer overflowed)."""
    case = make_dsa_case([300], [9], 8, DEVICE, topk=64)
    prefix = case.kv_indices[:300].long()
    keys, scales = index_views(case.index_buf)
    keys[prefix] = keys[prefix[0]].clone()
    scales[prefix, 32] = scales[prefix[0], 32] * (1 + 5e-4 * torch.randperm(300, device=DEVICE).float())
    out, ws = _run(case, 8, candidates=candidates)
    counts = _boundary_counts(ws, 9, 64)
    if candidates is not None:
        assert max(counts) > candidates, counts  # the overflow this case is for
    _check(case, out, ws)


@pytest.mark.parametrize("scale", [2.0**40, 2.0**-40])
def test_a_boundary_in_an_end_bucket_is_resolved_over_every_bit(scale):
    """Index scales 2^40 (or 2^-40) times larger put the logits beyond the buckets' window, so the k-th key lies in
    an end bucket, whose keys share no high bits (the resolve takes four rounds there, three inside the window):
    the selected set is still the float64 reference's."""
    case = make_dsa_case([300], [9], 8, DEVICE, topk=64)
    _, scales = index_views(case.index_buf)
    scales[:, 32] *= scale
    out, ws = _run(case, 8)
    hist = ws.state[:9, :256].cpu()
    assert (hist[:, 128] + hist[:, 255] + hist[:, 0] + hist[:, 127] > 64).all()  # the rows crowd the end buckets
    # and the 64th key of each token's row lies in one of them: the resolve's 32-bit path is the one that ran
    from_top = hist.flip(1).cumsum(1)
    boundary = 255 - (from_top >= 64).int().argmax(1)
    assert set(boundary.tolist()) <= {0, 127, 128, 255}, boundary.tolist()
    _check(case, out, ws)


def test_exact_ties_overflowing_the_candidate_buffer():
    """All prefix keys identical (exact ties) and a buffer smaller than the tie: the fallback still writes exactly k
    distinct visible slots."""
    case = make_dsa_case([200], [5], 8, DEVICE, topk=32, tree="chain")
    buf = case.index_buf
    prefix = case.kv_indices[:200].long()
    buf[prefix] = buf[prefix[0]].clone()
    _, ws = _run(case, 8, candidates=8)
    for t in range(5):
        got = ws.sel[t, : int(ws.sel_count[t])].cpu().tolist()
        assert int(ws.sel_count[t]) == 32 and len(set(got)) == 32
        assert set(got) <= set(prefix.cpu().tolist()) | set(case.tree_slots.cpu().tolist()[: t + 1])


def test_the_dense_shortcut_equals_the_sparse_take_all():
    """Where every key fits the top-k the plan runs the dense verify; the sparse path planned for a longer context
    (a server's plan: the take-all decided per request on the GPU, no logits) attends the same keys."""
    case = make_dsa_case([40, 0, 25], [9, 3, 5], 8, DEVICE, topk=64)
    plan = plan_dsa_verify(3, 8, 9, 17, case.max_context, TARGET, topk=64)
    assert plan.dense_shortcut and "dense verify" in plan.describe()
    dense, none = _run(case, 8)
    sparse, ws = _run(case, 8, max_context=500)
    assert none is None and ws is not None
    _check(case, dense)
    _check(case, sparse, ws)
    assert (dense.double() - sparse.double()).norm() / sparse.double().norm() < 1e-2


def test_a_call_run_kernel_by_kernel_is_the_whole_call():
    """The benchmarks time a stage's kernels apart (STAGE_KERNELS): run one by one in order, they leave the same
    selection and output as the whole call; a stage name that is none of them is refused, naming the choices."""
    case = make_dsa_case([300], [9], 8, DEVICE, topk=64)
    plan = plan_dsa_verify(1, 8, 9, 9, case.max_context, TARGET, topk=64)
    whole_ws, parts_ws = DSAWorkspace(plan, DEVICE), DSAWorkspace(plan, DEVICE)
    whole = torch.empty(9, 8, 512, dtype=torch.bfloat16, device=DEVICE)
    parts = torch.full_like(whole, float("nan"))
    run_dsa_verify(plan, whole_ws, *case.args, whole, sm_scale=case.sm_scale)
    for kernel in ("indexer", "topk_histogram", "topk_collect", "topk_resolve", "attention"):
        run_dsa_verify(plan, parts_ws, *case.args, parts, sm_scale=case.sm_scale, stages=(kernel,))
    assert [_selected(parts_ws, t) for t in range(9)] == [_selected(whole_ws, t) for t in range(9)]
    # the same keys; on a GPU the collect pass's atomics may order them otherwise, so the sums only to rounding
    assert (parts.double() - whole.double()).norm() / whole.double().norm() < 1e-3
    with pytest.raises(ValueError, match="unknown DSA stage merge: choose from attention, indexer"):
        run_dsa_verify(plan, parts_ws, *case.args, parts, sm_scale=case.sm_scale, stages=("merge",))


def test_a_tile_table_given_to_the_plan_sets_its_splits():
    """plan_dsa_verify(tiles=...) replaces the target's DSATiles (the sweep's variants): programs an SM set the
    indexer's and the collect pass's split counts."""
    import dataclasses

    from ddtree_kernels.dsa.launcher import DSA_SM120
    from ddtree_kernels.target import Target

    sm120 = Target.named("sm120")
    base = plan_dsa_verify(1, 8, 9, 9, 185_000, sm120)
    indexer = dataclasses.replace(DSA_SM120.indexer, programs_per_sm=DSA_SM120.indexer.programs_per_sm * 2)
    more = dataclasses.replace(DSA_SM120, indexer=indexer, topk=dataclasses.replace(DSA_SM120.topk, programs_per_sm=2))
    plan = plan_dsa_verify(1, 8, 9, 9, 185_000, sm120, tiles=more)
    assert plan.tiles is more and base.tiles is DSA_SM120
    assert plan.index_splits > base.index_splits and plan.topk_splits < base.topk_splits


def test_short_rows_give_the_indexer_programs_to_token_groups():
    """Where a row's key splits (of at least min_chunk keys) leave program slots idle, the indexer's grid has more
    programs, which the kernel gives to groups of the tree's tokens (test_dsa_matches_the_reference runs that on the
    interpreter's 8 slots: a 309-key row has 2 splits and 8 programs); a long row fills the slots with splits alone."""
    from ddtree_kernels.dsa.launcher import DSA_SM120
    from ddtree_kernels.target import Target

    sm120 = Target.named("sm120")
    slots = sm120.sms * DSA_SM120.indexer.programs_per_sm
    short = plan_dsa_verify(1, 8, 9, 9, 8192, sm120)
    key_splits = -(-short.logits_width // DSA_SM120.min_chunk)
    assert key_splits < short.index_splits <= min(slots, key_splits * DSA_SM120.indexer.block_m)
    long = plan_dsa_verify(1, 8, 9, 9, 185_000, sm120)
    assert long.index_splits <= slots
    assert plan_dsa_verify(1, 8, 9, 9, 300, TARGET, topk=64).index_splits > 2
