"""SGLang's verify hook: `TritonAttnBackend.verify_splitkv_fwd`, served by our kernels.

SGLang (0.5.14+) calls the hook for TARGET_VERIFY with the positional arguments of
`extend_attention_fwd` and falls back to `extend_attention_fwd` when it returns
False. We return False, before writing anything, for every input we do not
serve; `unsupported_reason` says which one and why, and verify_stats.py logs
it (once a shape) and counts it, so a fallback is never silent.
"""

from __future__ import annotations

import torch

from ..inputs import tensor_problem
from ..interpreter import interpreting
from ..launcher import Workspace, cache_layout, plan_verify, run_verify, shared_workspace
from ..target import Target
from ..tree import MASK_CHAIN, MASK_COMPACT, MASK_FULL, MASK_SGLANG_FLAT
from .verify_config import VerifyConfig
from .verify_stats import STATS

# Keyword arguments SGLang may pass that do not change what the kernel must compute,
# with the values under which that holds.
_NEUTRAL_KWARGS = {
    "page_size": (1, None),
    "score_mod": (None,),
    "aux_tensors": (None,),
    "skip_prefix": (False, None),
    "skip_extend": (False, None),
    "skip_prefix_custom_mask": (True, None),
}
_IGNORED_KWARGS = {"extend_seq_lens_cpu", "identity_kv_indices", "lse_extend"}


def unsupported_reason(
    q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices,
    custom_mask, is_causal, mask_indptr, max_len_extend,
    *, logit_cap=0.0, sliding_window_size=-1, sinks=None, window_kv_offsets=None,
    xai_temperature_len=-1, **kwargs,
) -> str | None:
    """Why the kernel does not serve this call, or None when it does."""
    if sinks is not None:
        return "attention sinks"
    if sliding_window_size is not None and sliding_window_size > 0:
        return "sliding-window attention"
    if window_kv_offsets is not None:
        return "sliding-window KV offsets"
    if logit_cap is not None and logit_cap > 0:
        return "logit soft-capping"
    if xai_temperature_len is not None and xai_temperature_len > 0:
        return "xai temperature scaling"
    for key, value in kwargs.items():
        if key in _IGNORED_KWARGS:
            continue
        if key not in _NEUTRAL_KWARGS:
            if value is not None:
                return f"unknown argument {key}={value!r}"
        elif not any(value is ok or value == ok for ok in _NEUTRAL_KWARGS[key]):
            return f"{key}={value!r}"
    problem = tensor_problem(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer)
    if problem is not None:
        return problem
    if q_extend.device.type != "cuda" and not interpreting():
        return f"tensors on {q_extend.device} (needs CUDA)"
    if custom_mask is not None and mask_indptr is None:
        return "custom_mask without mask_indptr"
    if not isinstance(max_len_extend, int) or max_len_extend < 1:
        return f"max_len_extend={max_len_extend!r} (needs a python int >= 1)"
    return None


def _shape_key(q_extend, o_extend, k_buffer, custom_mask) -> tuple:
    """What a decision depends on, for logging it once: heads, head dims, dtypes, mask or not."""
    heads = q_extend.shape[1] if q_extend.dim() == 3 else -1
    return (heads, q_extend.shape[-1], o_extend.shape[-1], str(q_extend.dtype).removeprefix("torch."),
            str(k_buffer.dtype).removeprefix("torch."), custom_mask is not None)


def sglang_verify_fwd(
    q_extend: torch.Tensor,
    k_extend: torch.Tensor,
    v_extend: torch.Tensor,
    o_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    custom_mask: torch.Tensor | None,
    is_causal: bool,
    mask_indptr: torch.Tensor | None,
    max_len_extend: int,
    k_scale: float | torch.Tensor = 1.0,
    v_scale: float | torch.Tensor = 1.0,
    sm_scale: float | None = None,
    *,
    logit_cap: float = 0.0,
    sliding_window_size: int = -1,
    sinks: torch.Tensor | None = None,
    window_kv_offsets: torch.Tensor | None = None,
    xai_temperature_len: int = -1,
    max_bs: int | None = None,
    tree_visibility: torch.Tensor | None = None,
    target: Target | None = None,
    workspace: Workspace | None = None,
    config: VerifyConfig | None = None,
    **kwargs,
) -> bool:
    """Write o_extend and return True, or return False (nothing written) to let SGLang fall back.

    tree_visibility: the tree as compact rows ([T, stride], uint8 or bool), given by a DDTree server
    that builds no flat mask (patch 0004); it replaces custom_mask. `config`: the backend's verify
    configuration (its target and the pool's cache, read once when it was built); without it, `target` (default
    `Target.detect` of the tensors' device) and the buffers given say. `workspace`: the caller's (the backend
    reserves one before CUDA-graph capture); a call it does not fit uses the shared one.
    """
    reason = unsupported_reason(
        q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices,
        custom_mask, is_causal, mask_indptr, max_len_extend,
        logit_cap=logit_cap, sliding_window_size=sliding_window_size, sinks=sinks,
        window_kv_offsets=window_kv_offsets, xai_temperature_len=xai_temperature_len, **kwargs,
    )
    STATS.record(reason, _shape_key(q_extend, o_extend, k_buffer,
                                    custom_mask if tree_visibility is None else tree_visibility))
    if reason is not None:
        return False
    T, H, d_qk = q_extend.shape
    d_v = o_extend.shape[-1]
    bs = qo_indptr.shape[0] - 1
    if T == 0 or bs == 0:
        return True
    if config is not None and config.cache_known:
        kv_fp8, v_from_k, target = config.kv_fp8, config.v_from_k, config.target
    else:
        kv_fp8, v_from_k = cache_layout(k_buffer, v_buffer)
        target = config.target if config is not None else target
    plan = plan_verify(bs, H, max_len_extend, T, target or q_extend.device, d_v=d_v, d_rope=d_qk - d_v,
                       kv_fp8=kv_fp8, v_from_k=v_from_k)
    if workspace is None or not workspace.fits(plan):
        workspace = shared_workspace(plan, q_extend.device)
    if tree_visibility is not None:
        mode, mask, row_stride = MASK_COMPACT, tree_visibility, tree_visibility.stride(0)
    elif custom_mask is not None:
        mode, mask, row_stride = MASK_SGLANG_FLAT, custom_mask, 0
    else:
        mode, mask, row_stride = (MASK_CHAIN if is_causal else MASK_FULL), None, 0
    if mask is not None and mask.dtype == torch.bool:
        mask = mask.view(torch.uint8)
    lse_extend = kwargs.get("lse_extend")
    run_verify(
        plan, workspace,
        q_extend, k_buffer, v_buffer, kv_indptr, kv_indices, k_extend, v_extend, qo_indptr, o_extend,
        mask_mode=mode, mask=mask, mask_indptr=mask_indptr, mask_row_stride=row_stride,
        sm_scale=sm_scale if sm_scale is not None else d_qk ** -0.5,
        k_scale=k_scale, v_scale=v_scale, lse_out=lse_extend,
    )
    return True
