"""The TritonAttnBackend subclass that routes TARGET_VERIFY to ddtree_kernels.

SGLang's TritonAttnBackend (0.5.14+) calls `self.verify_splitkv_fwd(...)` for
TARGET_VERIFY when `self.use_verify_splitkv` is true and falls back to
`extend_attention_fwd` when it returns False. The subclass turns that hook on and
points it at `ddtree_kernels.sglang_verify_fwd`. The class is built from the
TritonAttnBackend that the patched registry passes in, so it follows the installed
SGLang release without importing it here.

This module's name ends in `triton_backend` on purpose: DDTree's worker decides how to feed a
verify backend from its module name (`resolve_ddtree_target_backend_capability`, ddtree_utils.py:
`module.endswith("triton_backend")` gets the flat tree mask); under any other name a DDTree server
refuses the backend at its first decode step.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger("ddtree_kernels")

DDTREE_BACKEND_NAME = "DDTreeTritonAttnBackend"
_CHOICES = ("ddtree", "sglang")
_announced = False


def verify_kernel_choice() -> str:
    """DDTREE_VERIFY_KERNEL: 'ddtree' (default) or 'sglang' (SGLang's own verify path)."""
    choice = os.environ.get("DDTREE_VERIFY_KERNEL", "ddtree").strip().lower()
    if choice not in _CHOICES:
        raise ValueError(f"DDTREE_VERIFY_KERNEL={choice!r}: use one of {', '.join(_CHOICES)}")
    return choice


def _verify_mask_capacity(max_num_tokens: int, max_context_len: int, width: int) -> int:
    """Bytes of SGLang's flat verify mask: every request's [n, P + n] block at the longest P."""
    return max_num_tokens * (max_context_len + width)


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


def ddtree_backend_class(base: type) -> type:
    """Subclass `base` (SGLang's TritonAttnBackend) with the verify hook set to our kernel."""
    import torch

    from ..sglang_adapter import sglang_verify_fwd

    hook = torch.compiler.disable(sglang_verify_fwd)  # as SGLang wraps its own verify kernels

    class DDTreeTritonAttnBackend(base):  # name checked by the mask policy
        def __init__(self, model_runner, *args, **kwargs):
            super().__init__(model_runner, *args, **kwargs)
            self.ddtree_verify_width = verify_width(model_runner.server_args)
            _announce_plan(self, model_runner)
            self.use_verify_splitkv = True
            self.use_verify_shared_kv = False  # 0.5.18+: prefer our hook over the chain-only kernel
            self.verify_splitkv_fwd = hook

        def init_cuda_graph_state(self, max_bs, max_num_tokens, *args, **kwargs):
            super().init_cuda_graph_state(max_bs, max_num_tokens, *args, **kwargs)
            # SGLang sizes the captured mask max_num_tokens * max_context_len (0.5.14-0.5.17 and the
            # DDTree branches); a tree verify at full context needs its width more columns per row.
            # (0.5.18+ releases keep it in a VerifyMask already sized n * (context + n) per request.)
            mask = getattr(self, "cuda_graph_custom_mask", None)
            need = _verify_mask_capacity(max_num_tokens, int(self.max_context_len), self.ddtree_verify_width)
            if mask is not None and mask.numel() < need:
                self.cuda_graph_custom_mask = mask.new_zeros(need)

    DDTreeTritonAttnBackend.__qualname__ = DDTREE_BACKEND_NAME
    return DDTreeTritonAttnBackend


_described: set[tuple] = set()


def _announce_plan(backend, model_runner) -> None:
    """Log once per served shape which kernels a one-request verify launches (VerifyPlan.describe)."""
    import torch

    from ..launcher import plan_verify

    heads = int(getattr(backend, "num_head", 0) or 0)
    width = int(backend.ddtree_verify_width or 0)
    pool = getattr(model_runner, "token_to_kv_pool", None)
    fp8 = getattr(pool, "dtype", None) in (torch.float8_e4m3fn,)
    key = (heads, width, fp8, str(getattr(backend, "device", "")))
    if key in _described or heads < 1 or width < 1 or getattr(model_runner, "is_draft_worker", False):
        return
    _described.add(key)
    try:
        plan = plan_verify(1, heads, width, width, backend.device, kv_fp8=fp8)
        logger.warning("ddtree-sm120: %s", plan.describe())
    except Exception as exc:  # a description must never stop a server from starting
        logger.warning("ddtree-sm120: no verify plan description (%s: %s)", type(exc).__name__, exc)


def make_triton_backend(triton_backend_cls: type, runner, *args, **kwargs):
    """What the patched `create_triton_backend` returns: ours or SGLang's, per DDTREE_VERIFY_KERNEL."""
    global _announced
    choice = verify_kernel_choice()
    if choice == "ddtree":
        from .. import __version__

        backend = ddtree_backend_class(triton_backend_cls)(runner, *args, **kwargs)
        message = f"TARGET_VERIFY attention: ddtree_kernels {__version__} (DDTREE_VERIFY_KERNEL=ddtree)"
    else:
        backend = triton_backend_cls(runner, *args, **kwargs)
        message = "TARGET_VERIFY attention: SGLang extend_attention_fwd (DDTREE_VERIFY_KERNEL=sglang)"
    if not _announced:
        logger.warning("ddtree-sm120: %s", message)  # warning: SGLang's default log level hides info
        _announced = True
    return backend
