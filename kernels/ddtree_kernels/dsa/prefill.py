"""A DSA model's prefill at page size 1: each prompt token attends the top-k keys of its causal prefix, as SGLang's
DSA prefill does, run as chunks of the tree verify whose tree is a chain.

A chunk of `chunk` prompt tokens is one tree-verify call: its prefix is every key before the chunk (the cached
prefix and the chunk's predecessors) and its tree is a chain (a token sees the chunk's tokens up to itself), which is
the causal mask. The indexer's logits over a prompt of L tokens cost O(L^2) like SGLang's own DSA prefill; chunks
bound the workspace to `chunk` logits rows. A chunk whose keys all fit the top-k (the first `topk` tokens of a
prompt) is planned as such and runs the dense verify (DSAPlan.dense_shortcut): every key is selected there.

    prefill = DSAPrefill(num_heads=8, max_context=200_000, target=Target.detect("cuda"))
    prefill.run(q, k_buf, slots, prefix_len, index_q, index_weights, index_buf, out, sm_scale=q.shape[-1] ** -0.5)
"""

from __future__ import annotations

import torch

from ..launcher import kv_view
from ..target import Target
from .launcher import TOPK, DSAPlan, DSAWorkspace, plan_dsa_verify, run_dsa_verify

CHUNK = 64  # prompt tokens a call: the top-k pass keeps a chunk's chain in registers (N_MAX)


class DSAPrefill:
    """Plans by chunk length, one workspace, and the chain's visibility; `run` serves one request."""

    def __init__(self, *, num_heads: int, max_context: int, target: Target, topk: int = TOPK, index_heads: int = 32,
                 chunk: int = CHUNK):
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk}")
        self.num_heads, self.max_context, self.target = num_heads, max_context, target
        self.topk, self.index_heads, self.chunk = topk, index_heads, chunk
        self._plans: dict[tuple[int, bool, bool], DSAPlan] = {}
        self._workspace: DSAWorkspace | None = None
        self._chain: torch.Tensor | None = None

    def plan(self, n: int, kv_fp8: bool = False, short: bool = False) -> DSAPlan:
        """The plan of a chunk of n tokens; `short`: its prefix and itself fit the top-k (the dense shortcut)."""
        key = (n, kv_fp8, short)
        if key not in self._plans:
            context = max(0, self.topk - n) if short else self.max_context
            self._plans[key] = plan_dsa_verify(1, self.num_heads, n, n, context, self.target, topk=self.topk,
                                               index_heads=self.index_heads, kv_fp8=kv_fp8)
        return self._plans[key]

    def _buffers(self, plan: DSAPlan, device: torch.device) -> tuple[DSAWorkspace, torch.Tensor]:
        if self._workspace is None or not self._workspace.fits(plan):  # every chunk length's plan fits it
            plans = [self.plan(n, plan.kv_fp8, short) for n in range(1, self.chunk + 1) for short in (False, True)]
            self._workspace = DSAWorkspace.for_plans(plans, device)
        if self._chain is None or self._chain.device != device:
            self._chain = torch.tril(torch.ones(self.chunk, self.chunk, dtype=torch.uint8, device=device))
        return self._workspace, self._chain

    def run(self, q: torch.Tensor, k_buf: torch.Tensor, slots: torch.Tensor, prefix_len: int, index_q: torch.Tensor,
            index_weights: torch.Tensor, index_buf: torch.Tensor, out: torch.Tensor, *, sm_scale: float,
            k_scale=1.0) -> None:
        """One request's extend into `out` [T, H, D_V]: q [T, H, 576] absorbed queries, slots [prefix_len + T] int64
        (the request's slots in order: its cached prefix, then the T new tokens, whose rows and index keys are
        already stored), index_q [T, HI, 128] fp8 and index_weights [T, HI] from SGLang's indexer."""
        T = q.shape[0]
        if slots.shape[0] < prefix_len + T:
            raise ValueError(f"slots holds {slots.shape[0]} positions, the request needs {prefix_len + T}")
        if prefix_len + T > self.max_context + self.chunk:
            raise ValueError(f"a request of {prefix_len + T} tokens is longer than the {self.max_context} planned for")
        device = q.device
        kv_fp8 = kv_view(k_buf).dtype == torch.float8_e4m3fn
        starts = torch.arange(0, T, self.chunk, device=device, dtype=torch.int32)
        # Each chunk's [0, prefix] and [0, n] index pointers, made on the device once a request (no copy a chunk).
        kv_indptr = torch.stack([torch.zeros_like(starts), starts + prefix_len], dim=1)
        qo_indptr = torch.stack([torch.zeros_like(starts), torch.clamp(T - starts, max=self.chunk)], dim=1)
        for c, s in enumerate(range(0, T, self.chunk)):
            n = min(self.chunk, T - s)
            p = prefix_len + s
            plan = self.plan(n, kv_fp8, short=p + n <= self.topk)
            workspace, chain = self._buffers(plan, device)
            run_dsa_verify(plan, workspace, q[s:s + n], k_buf, kv_indptr[c], slots, qo_indptr[c], slots[p:p + n],
                           chain[:n, :n], index_q[s:s + n], index_weights[s:s + n], index_buf, out[s:s + n],
                           sm_scale=sm_scale, k_scale=k_scale)
