"""SGLang's flat verify mask written on the GPU from a compact tree visibility.

Our kernel reads a tree's compact visibility ([T, stride] rows, see tree.py), so a DDTree server
that feeds it (patch 0004) builds no O(context) flat mask. SGLang's own verify path, which runs
when our kernel declines a call, still reads the flat [n, P + n] block per request at
mask_indptr[req]; this writes it. Nothing is read back to the host, so it is safe inside
CUDA-graph capture when `out` is preallocated.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK = 1024


@triton.jit
def _flat_mask_kernel(
    vis, vis_row_stride, qo_indptr, kv_indptr, mask_indptr, out,
    BLOCK: tl.constexpr,
):
    tok = tl.program_id(0)
    req = tl.program_id(1)
    q_start = tl.load(qo_indptr + req)
    n_tok = tl.load(qo_indptr + req + 1) - q_start
    if tok >= n_tok:
        return
    prefix = (tl.load(kv_indptr + req + 1) - tl.load(kv_indptr + req)).to(tl.int64)
    width = prefix + n_tok
    row = tl.load(mask_indptr + req).to(tl.int64) + tok.to(tl.int64) * width
    vis_row = (q_start + tok).to(tl.int64) * vis_row_stride
    for start in range(0, width, BLOCK):
        cols = start + tl.arange(0, BLOCK).to(tl.int64)
        in_tree = (cols >= prefix) & (cols < width)
        seen = tl.load(vis + vis_row + (cols - prefix), mask=in_tree, other=1)
        tl.store(out + row + cols, (seen != 0).to(tl.int8), mask=cols < width)


def write_sglang_flat_mask(
    visibility: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    mask_indptr: torch.Tensor,
    out: torch.Tensor,
    max_draft_tokens: int,
) -> torch.Tensor:
    """Fill `out` (bool, flat) with SGLang's mask: prefix columns True, tree columns from `visibility`.

    visibility: uint8 or bool [T, stride], row = global draft token, column j = local draft token j.
    """
    if visibility.dim() != 2 or visibility.stride(1) != 1:
        raise ValueError(f"visibility must be [T, stride] with unit column stride, got {tuple(visibility.shape)}")
    bs = qo_indptr.shape[0] - 1
    if bs > 0 and max_draft_tokens > 0:
        vis = visibility.view(torch.uint8) if visibility.dtype == torch.bool else visibility
        flat = out.view(torch.int8) if out.dtype == torch.bool else out
        _flat_mask_kernel[(max_draft_tokens, bs)](
            vis, vis.stride(0), qo_indptr, kv_indptr, mask_indptr, flat, BLOCK=_BLOCK,
        )
    return out
