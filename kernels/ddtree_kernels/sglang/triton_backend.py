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
refuses the backend at its first decode step. With patch 0004 the worker asks the backend first
(`ddtree_verify_takes_visibility`) and feeds ours the tree's compact visibility instead: no flat
mask is built or copied, and a verify step's inputs no longer grow with the context.
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


def ddtree_feeds_visibility(backend) -> bool:
    """Whether the installed DDTree worker hands this backend the compact tree visibility (patch 0004).

    Asked of DDTree's own `resolve_ddtree_target_backend_capability`, the function the worker calls
    each step, so the backend and the worker cannot disagree. False where SGLang has no DDTree."""
    try:
        from sglang.srt.speculative.ddtree_utils import resolve_ddtree_target_backend_capability
    except ImportError:
        return False
    return bool(resolve_ddtree_target_backend_capability(backend).use_visibility)


def _verify_rows(spec_info) -> tuple | None:
    """(visibility [bs, n, n], n) of a DDTree verify fed without the flat mask; None otherwise."""
    visibility = getattr(spec_info, "visibility", None)
    if visibility is None or getattr(spec_info, "draft_token_num", None) is None:
        return None
    return visibility, int(spec_info.draft_token_num)


def ddtree_backend_class(base: type) -> type:
    """Subclass `base` (SGLang's TritonAttnBackend) with the verify hook set to our kernel."""
    import inspect

    import torch

    from ..flat_mask import write_sglang_flat_mask
    from ..sglang_adapter import sglang_verify_fwd
    from ..target import Target

    hook = torch.compiler.disable(sglang_verify_fwd)  # as SGLang wraps its own verify kernels
    hook_args = inspect.signature(sglang_verify_fwd)

    class DDTreeTritonAttnBackend(base):  # name checked by the mask policy
        # Read by DDTree's worker (patch 0004): feed this backend the tree's compact visibility, not the
        # flat [n, P + n] mask, which costs O(context) bytes a request every step and of which our
        # kernel reads only the tree columns.
        ddtree_verify_takes_visibility = True
        ddtree_verify_hook = hook

        def __init__(self, model_runner, *args, **kwargs):
            super().__init__(model_runner, *args, **kwargs)
            self.ddtree_verify_width = verify_width(model_runner.server_args)
            _announce_plan(self, model_runner)
            self.use_verify_splitkv = True
            self.use_verify_shared_kv = False  # 0.5.18+: prefer our hook over the chain-only kernel
            self.verify_splitkv_fwd = self._ddtree_verify
            self.ddtree_target = Target.detect(self.device)
            self.ddtree_workspace = None  # reserved with the CUDA-graph state, for every captured batch size
            self._tree_rows = None  # the verify in flight's tree as [T, stride] uint8 rows, or None
            self._graph_tree_rows = None
            self._graph_feeds_visibility = False  # set at capture: replays feed the captured rows

        def init_cuda_graph_state(self, max_bs, max_num_tokens, *args, **kwargs):
            super().init_cuda_graph_state(max_bs, max_num_tokens, *args, **kwargs)
            # SGLang sizes the captured mask max_num_tokens * max_context_len (0.5.14-0.5.17 and the
            # DDTree branches); a tree verify at full context needs its width more columns per row.
            # (0.5.18+ releases keep it in a VerifyMask already sized n * (context + n) per request.)
            # With the compact visibility only a declined call writes it (see _ddtree_verify).
            mask = getattr(self, "cuda_graph_custom_mask", None)
            need = _verify_mask_capacity(max_num_tokens, int(self.max_context_len), self.ddtree_verify_width)
            if mask is not None and mask.numel() < need:
                self.cuda_graph_custom_mask = mask.new_zeros(need)
            width = max(1, self.ddtree_verify_width)
            self._graph_tree_rows = torch.zeros((max_num_tokens, width), dtype=torch.uint8, device=self.device)
            self.ddtree_workspace = reserve_verify_workspace(self, max_bs)

        def init_forward_metadata(self, forward_batch):
            super().init_forward_metadata(forward_batch)
            self._tree_rows = None
            rows = _verify_rows(forward_batch.spec_info) if forward_batch.forward_mode.is_target_verify() else None
            if rows is not None and getattr(forward_batch.spec_info, "custom_mask", None) is None:
                visibility, n = rows
                self._tree_rows = visibility[:, :n, :n].reshape(-1, n).view(torch.uint8)

        def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False):
            super().init_forward_metadata_out_graph(forward_batch, in_capture)
            if not forward_batch.forward_mode.is_target_verify():
                return
            rows = _verify_rows(forward_batch.spec_info)
            if in_capture:
                # A DDTree target's verify carries the tree; a DFlash drafter's TARGET_VERIFY-mode pass does not.
                self._graph_feeds_visibility = rows is not None and ddtree_feeds_visibility(self)
                if not self._graph_feeds_visibility:
                    self._tree_rows = None
                    return
            elif not self._graph_feeds_visibility:
                return
            elif rows is None:
                raise RuntimeError("ddtree-sm120: a DDTree verify graph was captured for the tree's visibility, "
                                   "but this replay's verify input has none (spec_info.visibility is None)")
            # Captured kernels read a fixed buffer: request r's token i is row r * n + i, stride = width.
            visibility, n = rows
            bs = forward_batch.batch_size
            width = self._graph_tree_rows.shape[1]
            live = min(bs, visibility.shape[0])
            view = self._graph_tree_rows[: bs * n].view(bs, n, width)
            view[:live, :, :n].copy_(visibility[:live, :n, :n])
            self._tree_rows = self._graph_tree_rows[: bs * n]

        def _ddtree_verify(self, *args, **kwargs):
            tree_rows = self._tree_rows
            if hook(*args, tree_visibility=tree_rows, target=self.ddtree_target, workspace=self.ddtree_workspace,
                    **kwargs):
                return True
            if tree_rows is not None:
                # SGLang's own path runs next and reads the flat mask (forward_metadata.custom_mask,
                # read after this returns): write it from the tree.
                call = hook_args.bind(*args, **kwargs).arguments
                self.forward_metadata.custom_mask = write_sglang_flat_mask(
                    tree_rows, call["qo_indptr"], call["kv_indptr"], call["mask_indptr"],
                    self._flat_mask_for(call["mask_indptr"]), int(call["max_len_extend"]))
            return False

        def _flat_mask_for(self, mask_indptr):
            """The captured graph's mask buffer, or (eager) one sized from mask_indptr's end."""
            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                return self.cuda_graph_custom_mask
            need = int(mask_indptr[-1])
            current = self.forward_metadata.custom_mask
            if current is not None and current.numel() >= need:
                return current
            return torch.empty(need, dtype=torch.bool, device=mask_indptr.device)

    if takes_kv_fill(base):
        DDTreeTritonAttnBackend._fill_kv_indptr_and_indices = _fill_kv_indptr_and_indices
    DDTreeTritonAttnBackend.__qualname__ = DDTREE_BACKEND_NAME
    return DDTreeTritonAttnBackend


# The body of SGLang's `_fill_kv_indptr_and_indices` that ours replaces (0.5.14-0.5.20 and the DDTree branches);
# 0.5.21+ fill the list through a KV index translator and keep their own.
KV_FILL_BODY = [
    "kv_indptr = self.kv_indptr[:bs + 1]",
    "kv_indptr[1:] = torch.cumsum(seq_lens, dim=0)",
    "create_flashinfer_kv_indices_triton[bs,](self.req_to_token, req_pool_indices, seq_lens, kv_indptr, None, "
    "kv_indices, self.req_to_token.stride(0))",
    "return kv_indptr",
]


def kv_fill_statements(fn) -> list[str] | None:
    """A `_fill_kv_indptr_and_indices` definition (ast.FunctionDef) as statements, or None for another signature."""
    import ast

    if [a.arg for a in fn.args.args] != ["self", "bs", "seq_lens", "req_pool_indices", "kv_indices"]:
        return None
    body = fn.body[1:] if isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant) else fn.body
    return [ast.unparse(stmt) for stmt in body]


def kv_fill_body(base: type) -> list[str] | None:
    """The statements of `base._fill_kv_indptr_and_indices`, or None (another signature, no source)."""
    import ast
    import inspect
    import textwrap

    try:
        fn = ast.parse(textwrap.dedent(inspect.getsource(base._fill_kv_indptr_and_indices))).body[0]
    except (AttributeError, TypeError, OSError, SyntaxError):
        return None
    return kv_fill_statements(fn)


def takes_kv_fill(base: type) -> bool:
    """Whether `base` builds the KV index list exactly as the method ours replaces does."""
    return kv_fill_body(base) == KV_FILL_BODY


def _fill_kv_indptr_and_indices(self, bs, seq_lens, req_pool_indices, kv_indices):
    """SGLang's method, same result, with the index copy spread over many programs a request (kv_indices.py)."""
    import torch

    from ..kv_indices import fill_kv_indices

    kv_indptr = self.kv_indptr[: bs + 1]
    kv_indptr[1:] = torch.cumsum(seq_lens, dim=0)
    fill_kv_indices(self.req_to_token, req_pool_indices, seq_lens, kv_indptr, kv_indices, bs=bs)
    return kv_indptr


def reserve_verify_workspace(backend, max_bs: int):
    """A workspace that fits this backend's verify at every batch size up to max_bs (allocated before graph
    capture, reused by every call), or None, logged, where the pool's layout cannot be read (the hook then
    uses the shared workspace)."""
    from ..launcher import Workspace, cache_layout, plan_verify

    try:
        pool = backend.token_to_kv_pool
        layer = int(getattr(pool, "start_layer", 0) or 0)
        k_buf, v_buf = pool.get_key_buffer(layer), pool.get_value_buffer(layer)
        kv_fp8, v_from_k = cache_layout(k_buf, v_buf)
        d_v, width, heads = int(v_buf.shape[-1]), max(1, int(backend.ddtree_verify_width)), int(backend.num_head)
        plans = [plan_verify(bs, heads, width, bs * width, backend.ddtree_target, d_v=d_v,
                             d_rope=int(k_buf.shape[-1]) - d_v, kv_fp8=kv_fp8, v_from_k=v_from_k)
                 for bs in range(1, max(1, int(max_bs)) + 1)]
        return Workspace.for_plans(plans, backend.device)
    except Exception as exc:  # a stand-in pool or another layout: the shared workspace still serves
        logger.warning("ddtree-sm120: no verify workspace reserved (%s: %s); using the shared one",
                       type(exc).__name__, exc)
        return None


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
