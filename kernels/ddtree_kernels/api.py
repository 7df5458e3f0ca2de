"""Standalone tree-verify attention for MLA, with a compact tree mask.

    out = tree_verify_attention(q, k_cache, kv_indptr, kv_indices, k_draft, qo_indptr,
                                visibility, sm_scale=1 / 16)

q [T, H, D_V + D_R]; k_cache [S, 1, D_V + D_R] (bf16, fp16 or float8_e4m3fn, values
are its first D_V columns unless v_cache is given); k_draft [T, 1, D_V + D_R] the
draft tokens' own latent rows; visibility bool [T, n_max] (see masks.py) or None
for a causal chain. Returns out [T, H, D_V] and, if asked, lse [T, H] (natural log).
"""

from __future__ import annotations

import torch

from .inputs import tensor_problem
from .launcher import Workspace, cache_layout, plan_verify, run_verify, shared_workspace
from .target import Target
from .tree import MASK_CHAIN, MASK_COMPACT


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(message)


def tree_verify_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    k_draft: torch.Tensor,
    qo_indptr: torch.Tensor,
    visibility: torch.Tensor | None = None,
    *,
    d_v: int = 512,
    v_cache: torch.Tensor | None = None,
    v_draft: torch.Tensor | None = None,
    sm_scale: float | None = None,
    k_scale: float | torch.Tensor = 1.0,
    v_scale: float | torch.Tensor = 1.0,
    max_draft_tokens: int | None = None,
    out: torch.Tensor | None = None,
    return_lse: bool = False,
    workspace: Workspace | None = None,
    num_splits: int | None = None,
    target: Target | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention of each draft token over its request's prefix and its tree ancestors.

    Safe inside CUDA-graph capture when `max_draft_tokens` (or `visibility`) is given
    and `workspace` is preallocated: nothing is read back to the host. `target`: the GPU to plan
    for (default `Target.detect(q.device)`; `Target.emulating("sm120", q.device)` runs sm_120's plan).
    """
    _check(q.dim() == 3, f"q must be [T, H, D], got shape {tuple(q.shape)}")
    T, H, d_qk = q.shape
    d_r = d_qk - d_v
    v_cache = k_cache if v_cache is None else v_cache
    v_draft = k_draft if v_draft is None else v_draft
    if out is None:
        out = torch.empty((T, H, d_v), dtype=q.dtype, device=q.device)
    problem = tensor_problem(q, k_draft, v_draft, out, k_cache, v_cache)
    _check(problem is None, f"tree_verify_attention: {problem}")
    _check(qo_indptr.dim() == 1 and kv_indptr.shape == qo_indptr.shape,
           f"qo_indptr and kv_indptr must both be [bs + 1], got {tuple(qo_indptr.shape)} and {tuple(kv_indptr.shape)}")
    if visibility is not None:
        _check(visibility.dim() == 2 and visibility.shape[0] == T,
               f"visibility must be bool [T={T}, n_max], got {tuple(visibility.shape)}")
        max_draft_tokens = max_draft_tokens or visibility.shape[1]
        mask = visibility.contiguous().view(torch.uint8) if visibility.dtype == torch.bool else visibility.contiguous()
    else:
        mask = None
    if max_draft_tokens is None:
        # Reading the lengths back synchronises: pass max_draft_tokens inside a CUDA graph.
        max_draft_tokens = int(torch.diff(qo_indptr).max()) if qo_indptr.numel() > 1 else 1

    bs = qo_indptr.shape[0] - 1
    kv_fp8, v_from_k = cache_layout(k_cache, v_cache)
    plan = plan_verify(max(bs, 1), H, max(max_draft_tokens, 1), T, target or Target.detect(q.device), d_v=d_v,
                       d_rope=d_r, num_splits=num_splits, kv_fp8=kv_fp8, v_from_k=v_from_k)
    workspace = workspace or shared_workspace(plan, q.device)
    lse = torch.empty((T, H), dtype=torch.float32, device=q.device) if return_lse else None
    if bs > 0 and T > 0:
        run_verify(
            plan, workspace, q, k_cache, v_cache, kv_indptr, kv_indices, k_draft, v_draft, qo_indptr, out,
            mask_mode=MASK_CHAIN if mask is None else MASK_COMPACT,
            mask=mask, mask_indptr=None, mask_row_stride=0 if mask is None else mask.stride(0),
            sm_scale=sm_scale if sm_scale is not None else d_qk ** -0.5,
            k_scale=k_scale, v_scale=v_scale, lse_out=lse,
        )
    return (out, lse) if return_lse else out
