"""sglang_verify_fwd's contract: False and nothing written for inputs it does not serve.

SGLang falls back to extend_attention_fwd when the hook returns False, so a False
that had already written part of o_extend would corrupt the fallback's output.
"""

from __future__ import annotations

import inspect

import pytest
import torch

import ddtree_kernels as dk
from ddtree_kernels.sglang import sglang_verify_fwd, unsupported_reason

from .cases import DEVICE, TARGET, make_case


def _call(case, out, *, q=None, k_buffer=None, v_buffer=None, k_extend=None, custom_mask="case",
          mask_indptr="case", max_len=None, **kwargs):
    return sglang_verify_fwd(
        case.q if q is None else q,
        case.k_draft if k_extend is None else k_extend,
        case.v_draft,
        out,
        case.k_cache if k_buffer is None else k_buffer,
        case.v_cache if v_buffer is None else v_buffer,
        case.qo_indptr, case.kv_indptr, case.kv_indices,
        case.custom_mask if custom_mask == "case" else custom_mask,
        True,
        case.mask_indptr if mask_indptr == "case" else mask_indptr,
        case.max_draft if max_len is None else max_len,
        1.0, 1.0, case.sm_scale,
        **kwargs, target=TARGET,
    )


@pytest.fixture(scope="module")
def case():
    return make_case([64], [9], 8, DEVICE)


DECLINED = {
    "sinks": dict(sinks=torch.zeros(8)),
    "sliding window": dict(sliding_window_size=128),
    "window offsets": dict(window_kv_offsets=torch.zeros(1, dtype=torch.int32)),
    "logit cap": dict(logit_cap=30.0),
    "xai temperature": dict(xai_temperature_len=4096),
    "paged KV": dict(page_size=16),
    "score_mod": dict(score_mod=lambda *a: a[0]),
    "skip_prefix": dict(skip_prefix=True),
    "unknown kwarg": dict(some_future_option=object()),
    "mask without indptr": dict(mask_indptr=None),
    "max_len as tensor": dict(max_len=torch.tensor(9)),
}


@pytest.mark.parametrize("kwargs", list(DECLINED.values()), ids=list(DECLINED))
def test_declined_inputs_return_false_and_write_nothing(case, kwargs):
    out = torch.full((9, 8, 512), 7.0, dtype=torch.bfloat16, device=DEVICE)
    assert _call(case, out, **kwargs) is False
    assert bool((out == 7.0).all())


def test_declined_shapes_and_dtypes(case):
    out = torch.full((9, 8, 512), 7.0, dtype=torch.bfloat16, device=DEVICE)
    two_heads = case.k_cache.expand(-1, 2, -1)
    assert _call(case, out, k_buffer=two_heads, v_buffer=two_heads[..., :512]) is False  # GQA, not MLA
    assert _call(case, out, q=case.q.float()) is False  # fp32 compute
    wide = torch.zeros(9, 8, 1024, dtype=torch.bfloat16, device=DEVICE)
    assert _call(case, out, q=wide) is False  # head dims disagree
    assert _call(case, out, k_buffer=case.k_cache.to(torch.float16), v_buffer=case.v_cache.to(torch.float16)) is False
    assert bool((out == 7.0).all())


def test_unsupported_reason_names_the_feature(case):
    args = (case.q, case.k_draft, case.v_draft, torch.empty(9, 8, 512, dtype=torch.bfloat16, device=DEVICE),
            case.k_cache, case.v_cache, case.qo_indptr, case.kv_indptr, case.kv_indices, case.custom_mask, True,
            case.mask_indptr, 9)
    assert unsupported_reason(*args) is None
    assert unsupported_reason(*args, sinks=torch.zeros(8)) == "attention sinks"
    assert "page_size" in unsupported_reason(*args, page_size=64)


def test_signature_matches_sglang_extend_attention_positionally():
    """The 16 positional parameters SGLang passes, in SGLang's order (DESIGN.md §2)."""
    params = list(inspect.signature(sglang_verify_fwd).parameters)
    assert params[:16] == [
        "q_extend", "k_extend", "v_extend", "o_extend", "k_buffer", "v_buffer", "qo_indptr", "kv_indptr",
        "kv_indices", "custom_mask", "is_causal", "mask_indptr", "max_len_extend", "k_scale", "v_scale",
        "sm_scale",
    ]


def test_both_entry_points_refuse_the_same_tensors(case):
    """One check (inputs.tensor_problem) serves the hook, which declines, and the standalone API, which raises."""
    wide = torch.zeros(9, 8, 1024, dtype=torch.bfloat16, device=DEVICE)
    args = (case.q, case.k_draft, case.v_draft, torch.empty(9, 8, 512, dtype=torch.bfloat16, device=DEVICE),
            case.k_cache, case.v_cache, case.qo_indptr, case.kv_indptr, case.kv_indices, case.custom_mask, True,
            case.mask_indptr, 9)
    reason = unsupported_reason(wide, *args[1:])
    assert reason is not None and "head dims disagree" in reason
    with pytest.raises(ValueError, match="head dims disagree"):
        dk.tree_verify_attention(wide, case.k_cache, case.kv_indptr, case.kv_indices, case.k_draft, case.qo_indptr,
                                 case.visibility, target=TARGET)
    fp32 = case.q.float()
    assert "q/out dtype" in unsupported_reason(fp32, *args[1:])
    with pytest.raises(ValueError, match="q/out dtype"):
        dk.tree_verify_attention(fp32, case.k_cache, case.kv_indptr, case.kv_indices, case.k_draft, case.qo_indptr,
                                 case.visibility, target=TARGET)
