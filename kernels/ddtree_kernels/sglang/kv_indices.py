"""The verify's page-size-1 KV index list, filled by many programs a request.

SGLang rebuilds kv_indices (every request's `req_to_token` row, concatenated at kv_indptr) before each
verify and each drafter pass, with one program a request (`create_flashinfer_kv_indices_triton`): at
185k tokens that one program walks 362 blocks in turn, 0.19 ms a call on the H200, twice a DDTree step.
Here each request's row is split over PROGRAMS programs. The grid does not depend on the lengths, so
it is safe inside CUDA-graph capture.
"""

from __future__ import annotations

import ast
import inspect
import textwrap

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


# The body of SGLang's `_fill_kv_indptr_and_indices` that ours replaces (0.5.14-0.5.20 and the DDTree branches);
# 0.5.21+ fill the list through a KV index translator and keep their own.
_SGLANG_FILL_BODY = [
    "kv_indptr = self.kv_indptr[:bs + 1]",
    "kv_indptr[1:] = torch.cumsum(seq_lens, dim=0)",
    "create_flashinfer_kv_indices_triton[bs,](self.req_to_token, req_pool_indices, seq_lens, kv_indptr, None, "
    "kv_indices, self.req_to_token.stride(0))",
    "return kv_indptr",
]


def kv_fill_statements(fn: ast.FunctionDef | None) -> list[str] | None:
    """A `_fill_kv_indptr_and_indices` definition as its statements (docstring dropped), or None for another
    signature or no definition."""
    if fn is None or [a.arg for a in fn.args.args] != ["self", "bs", "seq_lens", "req_pool_indices", "kv_indices"]:
        return None
    body = fn.body[1:] if isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant) else fn.body
    return [ast.unparse(stmt) for stmt in body]


def replaces_kv_fill(fn: ast.FunctionDef | None) -> bool:
    """Whether our backend takes over this definition of SGLang's `_fill_kv_indptr_and_indices`: it builds the
    list exactly as the method ours replaces does (what the patched-source check asks of a release)."""
    return kv_fill_statements(fn) == _SGLANG_FILL_BODY


def takes_kv_fill(base: type) -> bool:
    """Whether `base` (SGLang's TritonAttnBackend) builds the KV index list exactly as ours does."""
    try:
        fn = ast.parse(textwrap.dedent(inspect.getsource(base._fill_kv_indptr_and_indices))).body[0]
    except (AttributeError, TypeError, OSError, SyntaxError):
        return False
    return replaces_kv_fill(fn)


def fill_kv_indptr_and_indices(self, bs, seq_lens, req_pool_indices, kv_indices):
    """SGLang's method (the backend's), same result, with the index copy spread over many programs a request."""
    kv_indptr = self.kv_indptr[: bs + 1]
    kv_indptr[1:] = torch.cumsum(seq_lens, dim=0)
    fill_kv_indices(self.req_to_token, req_pool_indices, seq_lens, kv_indptr, kv_indices, bs=bs)
    return kv_indptr
