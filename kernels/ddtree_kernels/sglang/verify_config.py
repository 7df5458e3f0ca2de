"""The one verify configuration a DDTree backend serves, computed once when SGLang builds the backend.

Width, heads, the cache's layout and the target are static for a server's life: the backend reads them here
when it is built and hands this object to its start-up description, its workspace and every verify call, so
no layer's call derives them again.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..launcher import VerifyPlan, Workspace, cache_layout, plan_verify
from ..target import Target


def verify_width(server_args) -> int:
    """Draft tokens a request verifies at most: the DFlash block, or DDTree's budget + 1 if larger.

    SGLang sizes its graph mask with speculative_num_draft_tokens (the DFlash block, e.g. 16),
    but DDTree verifies budget + 1 tokens a request (65 at budget 64)."""
    width = int(getattr(server_args, "speculative_num_draft_tokens", 0) or 0)
    if str(getattr(server_args, "speculative_algorithm", "") or "").upper() == "DDTREE":
        budget = getattr(server_args, "speculative_ddtree_budget", None)
        if budget is not None:
            width = max(width, int(budget) + 1)
    return width


@dataclass(frozen=True)
class VerifyConfig:
    """What every verify call of one backend shares."""

    width: int  # draft tokens a request verifies at most (verify_width)
    heads: int  # query heads a GPU; 0 where the backend does not say
    target: Target
    # The pool's cache (launcher.cache_layout); None where the backend has no pool to read (a stand-in in a
    # test), and then each call's buffers say.
    kv_fp8: bool | None = None
    v_from_k: bool | None = None
    d_v: int = 512
    d_rope: int = 64

    @classmethod
    def for_backend(cls, backend, model_runner) -> VerifyConfig:
        """The configuration of `backend` (SGLang's TritonAttnBackend, built) on `model_runner`'s pool."""
        base = dict(width=verify_width(model_runner.server_args), heads=int(getattr(backend, "num_head", 0) or 0),
                    target=Target.detect(backend.device))
        pool = getattr(model_runner, "token_to_kv_pool", None) or getattr(backend, "token_to_kv_pool", None)
        try:
            layer = int(getattr(pool, "start_layer", 0) or 0)
            k_buf, v_buf = pool.get_key_buffer(layer), pool.get_value_buffer(layer)
        except (AttributeError, TypeError, IndexError, KeyError):  # no pool (a stand-in): the calls say
            return cls(**base)
        kv_fp8, v_from_k = cache_layout(k_buf, v_buf)
        d_v = int(v_buf.shape[-1])
        return cls(**base, kv_fp8=kv_fp8, v_from_k=v_from_k, d_v=d_v, d_rope=int(k_buf.shape[-1]) - d_v)

    @property
    def cache_known(self) -> bool:
        return self.kv_fp8 is not None and self.v_from_k is not None

    def plan(self, batch_size: int, max_draft_tokens: int, total_tokens: int) -> VerifyPlan:
        """The plan of one call (plan_verify is cached: a dictionary lookup after the first call of a shape)."""
        return plan_verify(batch_size, self.heads, max_draft_tokens, total_tokens, self.target, d_v=self.d_v,
                           d_rope=self.d_rope, kv_fp8=bool(self.kv_fp8), v_from_k=self.v_from_k is not False)

    def workspace(self, max_bs: int, device: torch.device | str) -> Workspace:
        """One workspace that every batch size up to max_bs fits at the full width (before graph capture)."""
        width = max(1, self.width)
        plans = [self.plan(bs, width, bs * width) for bs in range(1, max(1, int(max_bs)) + 1)]
        return Workspace.for_plans(plans, device)

    def describe(self) -> str:
        """What a one-request verify at the full width launches (VerifyPlan.describe)."""
        return self.plan(1, self.width, self.width).describe()
