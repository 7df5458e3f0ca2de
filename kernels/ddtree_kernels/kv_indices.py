"""The verify's page-size-1 KV index list, filled by many programs a request.

SGLang rebuilds kv_indices (every request's `req_to_token` row, concatenated at kv_indptr) before each
verify and each drafter pass, with one program a request (`create_flashinfer_kv_indices_triton`): at
185k tokens that one program walks 362 blocks in turn, 0.19 ms a call on the H200, twice a DDTree step.
Here each request's row is split over PROGRAMS programs. The grid does not depend on the lengths, so
it is safe inside CUDA-graph capture.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024
PROGRAMS = 128  # per request: 185k tokens take two passes of each program


@triton.jit
def _kv_indices_kernel(
    req_to_token, req_pool_indices, seq_lens, kv_indptr, kv_indices, row_stride,
    BLOCK: tl.constexpr, PROGRAMS: tl.constexpr,
):
    req = tl.program_id(0)
    part = tl.program_id(1)
    row = tl.load(req_pool_indices + req).to(tl.int64) * row_stride
    length = tl.load(seq_lens + req).to(tl.int32)
    start = tl.load(kv_indptr + req).to(tl.int64)
    for first in range(part * BLOCK, length, PROGRAMS * BLOCK):
        offs = first + tl.arange(0, BLOCK)
        ok = offs < length
        slots = tl.load(req_to_token + row + offs, mask=ok)
        tl.store(kv_indices + start + offs, slots, mask=ok)


def fill_kv_indices(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    bs: int | None = None,
) -> torch.Tensor:
    """kv_indices[kv_indptr[i] + j] = req_to_token[req_pool_indices[i], j] for j < seq_lens[i], i < bs."""
    bs = req_pool_indices.shape[0] if bs is None else bs
    if bs > 0:
        _kv_indices_kernel[(bs, PROGRAMS)](
            req_to_token, req_pool_indices, seq_lens, kv_indptr, kv_indices, req_to_token.stride(0),
            BLOCK=BLOCK, PROGRAMS=PROGRAMS,
        )
    return kv_indices
