"""The TritonAttnBackend subclass that routes TARGET_VERIFY to ddtree_kernels.

SGLang's TritonAttnBackend (0.5.14+) calls `self.verify_splitkv_fwd(...)` for
TARGET_VERIFY when `self.use_verify_splitkv` is true and falls back to
`extend_attention_fwd` when it returns False. The subclass turns that hook on and
points it at `ddtree_kernels.sglang.sglang_verify_fwd`. The class is built from the
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

from .verify_config import VerifyConfig, verify_width

logger = logging.getLogger("ddtree_kernels")

__all__ = ["DDTREE_BACKEND_NAME", "ddtree_backend_class", "make_triton_backend", "reserve_verify_workspace",
           "verify_kernel_choice", "verify_width"]

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

    from .adapter import sglang_verify_fwd
    from .dsa_verify import DSAVerify
    from .flat_mask import write_sglang_flat_mask
    from .kv_indices import fill_kv_indptr_and_indices, takes_kv_fill

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
            # Width, heads, the pool's cache and the target, read once: the description, the workspace and
            # every verify call take them from here.
            self.ddtree_config = VerifyConfig.for_backend(self, model_runner)
            if not getattr(model_runner, "is_draft_worker", False):
                _announce_plan(self.ddtree_config)
            self.use_verify_splitkv = True
            self.use_verify_shared_kv = False  # 0.5.18+: prefer our hook over the chain-only kernel
            self.verify_splitkv_fwd = self._ddtree_verify
            self.ddtree_workspace = None  # reserved with the CUDA-graph state, for every captured batch size
            self._tree_rows = None  # the verify in flight's tree as [T, stride] uint8 rows, or None
            self._graph_tree_rows = None
            self._graph_feeds_visibility = False  # set at capture: replays feed the captured rows
            # A DSA model at page size 1 (patch 0007): its indexer stages queries, ranked and attended here.
            self.ddtree_dsa = None if getattr(model_runner, "is_draft_worker", False) else \
                DSAVerify.for_backend(self, model_runner)
            self._ddtree_layer = -1  # the layer whose forward_extend is running
            self._ddtree_batch = None  # and its batch (a DSA prefill reads its host lengths)
            if self.ddtree_dsa is not None:  # SGLang's extend kernel, wrapped: a DSA prefill is ours
                self._sglang_extend_fwd = self.extend_attention_fwd
                self.extend_attention_fwd = self._ddtree_extend

        @property
        def ddtree_dsa_prefill(self) -> bool:
            """Read by patch 0007's attention dispatch: a DSA target's extends take the absorbed (MLA) path, whose
            latent rows our sparse prefill attends."""
            return getattr(self, "ddtree_dsa", None) is not None

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
            if self.ddtree_dsa is not None:
                self.ddtree_dsa.reserve(max_bs, self.device)

        @property
        def ddtree_verify_width(self) -> int:
            return self.ddtree_config.width

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

        def get_indexer_metadata(self, layer_id, forward_batch):
            if getattr(self, "ddtree_dsa", None) is None:
                return super().get_indexer_metadata(layer_id, forward_batch)
            return self.ddtree_dsa.indexer_metadata(forward_batch)

        def forward_extend(self, q, k, v, layer, forward_batch, *args, **kwargs):
            self._ddtree_layer = layer.layer_id
            self._ddtree_batch = forward_batch
            return super().forward_extend(q, k, v, layer, forward_batch, *args, **kwargs)

        def _ddtree_extend(self, q, k, v, o, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, *args, **kwargs):
            """SGLang's extend kernel, but a DSA target's prefill goes to the sparse path (dsa_verify.py)."""
            batch = self._ddtree_batch
            if batch is not None and not batch.forward_mode.is_target_verify():
                sm_scale = args[6] if len(args) > 6 else kwargs.get("sm_scale")  # extend_attention_fwd's order
                if sm_scale is None:
                    sm_scale = q.shape[-1] ** -0.5
                if self.ddtree_dsa.prefill(self._ddtree_layer, q, o, k_buffer, kv_indices, batch, sm_scale):
                    return None
            return self._sglang_extend_fwd(q, k, v, o, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, *args,
                                           **kwargs)

        def _ddtree_verify(self, *args, **kwargs):
            tree_rows = self._tree_rows
            dsa = getattr(self, "ddtree_dsa", None)  # None: not a DSA model (or a stand-in built without __init__)
            if dsa is not None and self._ddtree_dsa_verify(hook_args.bind(*args, **kwargs).arguments, tree_rows):
                return True
            if hook(*args, tree_visibility=tree_rows, config=self.ddtree_config, workspace=self.ddtree_workspace,
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

        def _ddtree_dsa_verify(self, call: dict, tree_rows) -> bool:
            """The DSA model's verify: the staged index query ranked and attended (dsa_verify.py)."""
            q = call["q_extend"]
            sm_scale = call.get("sm_scale")
            return self.ddtree_dsa.run(self._ddtree_layer, q, call["o_extend"], call["k_buffer"], call["kv_indptr"],
                                       call["kv_indices"], call["qo_indptr"], tree_rows, call["max_len_extend"],
                                       q.shape[-1] ** -0.5 if sm_scale is None else sm_scale)

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
        DDTreeTritonAttnBackend._fill_kv_indptr_and_indices = fill_kv_indptr_and_indices
    DDTreeTritonAttnBackend.__qualname__ = DDTREE_BACKEND_NAME
    return DDTreeTritonAttnBackend


def reserve_verify_workspace(backend, max_bs: int):
    """A workspace that fits this backend's verify at every batch size up to max_bs (allocated before graph
    capture, reused by every call), or None, logged, where the configuration has no cache layout or heads (a
    stand-in backend: the hook then uses the shared workspace)."""
    config = backend.ddtree_config
    if not config.cache_known or config.heads < 1:
        logger.warning("ddtree-sm120: no verify workspace reserved (no pool layout or heads in %s); using the "
                       "shared one", config)
        return None
    return config.workspace(max_bs, backend.device)


_described: set[VerifyConfig] = set()


def _announce_plan(config: VerifyConfig) -> None:
    """Log once per served configuration which kernels a one-request verify launches (VerifyPlan.describe)."""
    if config in _described or config.heads < 1 or config.width < 1:
        return
    _described.add(config)
    try:
        logger.warning("ddtree-sm120: %s", config.describe())
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
