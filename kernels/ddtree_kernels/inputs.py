"""What a call's tensors must look like, checked once for both entry points.

`tree_verify_attention` (api.py) raises with the reason; `sglang_verify_fwd`
(sglang_adapter.py) declines the call with it, and SGLang falls back.
"""

from __future__ import annotations

import torch

COMPUTE_DTYPES = (torch.bfloat16, torch.float16)
FP8_CACHE_DTYPES = (torch.float8_e4m3fn, torch.uint8)  # uint8: an fp8 pool seen as raw bytes


def tensor_problem(q: torch.Tensor, k_draft: torch.Tensor, v_draft: torch.Tensor, out: torch.Tensor,
                   k_cache: torch.Tensor, v_cache: torch.Tensor) -> str | None:
    """Why these tensors are not an MLA verify call the kernels serve, or None.

    q [T, H, D_V + D_R] and out [T, H, D_V] in bf16/fp16; the draft rows k_draft [T, 1, D_V + D_R] and
    v_draft [T, 1, >= D_V] in q's dtype; the cache k_cache [S, 1, D_V + D_R] and v_cache [S, 1, >= D_V] in
    q's dtype or fp8_e4m3 (both alike); D_V <= 512 and D_R <= 64; every last dimension contiguous.
    """
    tensors = {"q": q, "k_draft": k_draft, "v_draft": v_draft, "out": out, "k_cache": k_cache, "v_cache": v_cache}
    flat = [name for name, t in tensors.items() if t.dim() != 3]
    if flat:
        return f"{', '.join(flat)} must be 3-d [tokens, heads, dim]"
    if k_draft.shape[1] != 1 or k_cache.shape[1] != 1 or v_cache.shape[1] != 1:
        return "more than one KV head (not MLA): k and v must be [N, 1, dim]"
    d_qk, d_v = q.shape[-1], out.shape[-1]
    if not (k_draft.shape[-1] == k_cache.shape[-1] == d_qk and d_v <= v_draft.shape[-1] and d_v <= v_cache.shape[-1]):
        return (f"head dims disagree: q and k need the same width ({d_qk}; k_draft {k_draft.shape[-1]}, "
                f"k_cache {k_cache.shape[-1]}) and v at least out's {d_v} (v_draft {v_draft.shape[-1]}, "
                f"v_cache {v_cache.shape[-1]})")
    if not (0 < d_v <= 512 and 0 <= d_qk - d_v <= 64):
        return f"head dims {d_qk}/{d_v} (needs d_v <= 512, d_qk - d_v <= 64)"
    if q.dtype not in COMPUTE_DTYPES or out.dtype != q.dtype:
        return f"q/out dtype {q.dtype}/{out.dtype} (needs bf16 or fp16, both alike)"
    if k_draft.dtype != q.dtype or v_draft.dtype != q.dtype:
        return f"draft k/v dtype {k_draft.dtype}/{v_draft.dtype} differs from q's {q.dtype}"
    if k_cache.dtype not in (q.dtype, *FP8_CACHE_DTYPES) or v_cache.dtype != k_cache.dtype:
        return f"KV cache dtype {k_cache.dtype}/{v_cache.dtype} (needs {q.dtype} or float8_e4m3fn, both alike)"
    strided = [name for name, t in tensors.items() if t.stride(-1) != 1]
    if strided:
        return f"{', '.join(strided)} not contiguous in the last dimension"
    return None
