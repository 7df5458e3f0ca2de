"""A DSA model's TARGET_VERIFY inside SGLang: the indexer hands our backend its queries, the backend ranks and
attends in one call (ddtree_kernels.dsa).

With patch 0007 SGLang's `Indexer` asks the attention backend for indexer metadata and, where it has a
`ddtree_stage_index_query`, stores the step's index keys in the page-size-1 pool as usual and hands over its fp8
queries and head gates instead of ranking keys itself (DeepGEMM's paged logits and SGLang's top-k need page size
64). The layer's attention follows at once: `DSAVerify.run` serves it from the staged query, the pool's index
buffer and the tree's compact visibility with `run_dsa_verify`, which selects each tree token's 2,048 keys among
its prefix and ancestors and attends only those. Staging is Python state set while a step runs (or is captured);
a replayed CUDA graph launches the same kernels on the same buffers, so it needs none.

Prefill is sparse too: where SGLang's indexer ranks (a request longer than `index_topk`), it stages the prompt's
queries the same way, the model's extends take the absorbed (MLA) path (patch 0007 asks `ddtree_dsa_prefill`), and
`DSAVerify.prefill` attends each prompt token's top-k causal keys in chunks (`ddtree_kernels.dsa.prefill`). Where
every key is in the top k the indexer stages nothing and SGLang's dense Triton extend is the model's own attention.
A verify this path cannot serve is declined, logged once a shape and counted (verify_stats.py) and runs the dense
tree verify; an extend it cannot serve runs SGLang's dense extend, logged once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from ..dsa import DSAPlan, DSAWorkspace, plan_dsa_verify, run_dsa_verify
from ..dsa.index_keys import INDEX_ROW_BYTES
from ..dsa.prefill import DSAPrefill
from ..launcher import kv_view
from ..target import Target
from .verify_stats import STATS

logger = logging.getLogger("ddtree_kernels")

LATENT_DIM = 576  # kv_lora_rank 512 + rope 64: the row the sparse attention reads


@dataclass
class StagedQuery:
    """One layer's index queries, handed over by SGLang's indexer for the attention that follows."""

    layer_id: int
    index_q: torch.Tensor  # [T, HI, 128] float8_e4m3fn
    index_weights: torch.Tensor  # [T, HI] float32, q scale and softmax scale folded in
    tree_slots: torch.Tensor  # [T] int64: where the tree tokens' latent rows and index keys are


class IndexerMetadata:
    """What our backend's `get_indexer_metadata` gives SGLang's indexer: only the stage hook (patch 0007)."""

    def __init__(self, verify: DSAVerify, forward_batch):
        self._verify = verify
        self._forward_batch = forward_batch

    def ddtree_stage_index_query(self, layer_id: int, q_fp8: torch.Tensor, weights: torch.Tensor) -> None:
        batch = self._forward_batch
        self._verify.staged = StagedQuery(int(layer_id), q_fp8, weights.reshape(q_fp8.shape[0], -1).float(),
                                          batch.out_cache_loc)


def is_dsa_pool(pool) -> bool:
    """A DSATokenToKVPool (SGLang's DSA pool): it keeps an index-key buffer a layer beside the latent rows."""
    return pool is not None and hasattr(pool, "get_index_k_with_scale_buffer")


def skipping_layers(hf_config) -> frozenset[int]:
    """Layers that reuse the previous layer's selection (index_topk_freq / index_topk_pattern / cli_factor)."""
    layers = int(getattr(hf_config, "num_hidden_layers", 0) or 0)
    factor = int(getattr(hf_config, "cli_factor", 1) or 1)
    if factor > 1:
        return frozenset(i for i in range(layers) if i % factor)
    try:
        from sglang.srt.configs.model_config import dsa_layer_skips_topk
    except ImportError:
        return frozenset()
    return frozenset(i for i in range(layers) if dsa_layer_skips_topk(hf_config, i))


class DSAVerify:
    """One backend's DSA verify: static facts read once (heads, top-k, longest context, target), plans by shape,
    and one workspace for every captured batch size."""

    def __init__(self, pool, *, heads: int, topk: int, index_heads: int, max_context: int, width: int,
                 target: Target, skip_layers: frozenset[int] = frozenset()):
        self.pool = pool
        self.heads, self.topk, self.index_heads = heads, topk, index_heads
        self.max_context, self.width, self.target = max_context, width, target
        self.skip_layers = skip_layers
        self.staged: StagedQuery | None = None
        self.tree_slots: torch.Tensor | None = None  # the step's, kept for layers that reuse a selection
        self.workspace: DSAWorkspace | None = None
        self._plans: dict[tuple[int, int, int], DSAPlan] = {}
        self._prefill: DSAPrefill | None = None
        self._prefill_declined: set[str] = set()

    @classmethod
    def for_backend(cls, backend, model_runner) -> DSAVerify | None:
        """The DSA verify of a backend whose pool is SGLang's DSA pool at page size 1; None for any other."""
        pool = getattr(model_runner, "token_to_kv_pool", None)
        if not is_dsa_pool(pool) or int(getattr(pool, "page_size", 1)) != 1:
            return None
        hf_config = model_runner.model_config.hf_config
        from .verify_config import verify_width

        verify = cls(pool, heads=int(getattr(backend, "num_head", 0) or 0),
                     topk=int(getattr(hf_config, "index_topk", 2048)),
                     index_heads=int(getattr(hf_config, "index_n_heads", 32)),
                     max_context=int(backend.max_context_len), width=verify_width(model_runner.server_args),
                     target=Target.detect(backend.device), skip_layers=skipping_layers(hf_config))
        logger.warning("ddtree-sm120: DSA TARGET_VERIFY: ddtree_kernels ranks the top %d of each tree token's keys "
                       "and attends them (%d index heads, page size 1)", verify.topk, verify.index_heads)
        return verify

    def indexer_metadata(self, forward_batch) -> IndexerMetadata:
        return IndexerMetadata(self, forward_batch)

    def plan(self, batch_size: int, max_draft_tokens: int, total_tokens: int) -> DSAPlan:
        key = (batch_size, max_draft_tokens, total_tokens)
        plan = self._plans.get(key)
        if plan is None:
            plan = plan_dsa_verify(batch_size, self.heads, max_draft_tokens, total_tokens, self.max_context,
                                   self.target, topk=self.topk, index_heads=self.index_heads)
            self._plans[key] = plan
        return plan

    def reserve(self, max_bs: int, device: torch.device | str) -> None:
        """One workspace that every verify up to max_bs requests of up to the full width fits (before graph capture:
        a captured call must never allocate). Its logits rows (4 bytes a key a tree token) dominate."""
        width = max(1, self.width)
        plans = [self.plan(bs, n, bs * n) for bs in range(1, max(1, int(max_bs)) + 1) for n in range(1, width + 1)]
        self.workspace = DSAWorkspace.for_plans(plans, device)
        size = sum(t.numel() * t.element_size() for t in vars(self.workspace).values() if isinstance(t, torch.Tensor))
        logger.warning("ddtree-sm120: DSA verify workspace %.1f MB (%d requests of %d tokens, %d keys a row)",
                       size / 2**20, max_bs, width, self.workspace.plan_size[1])

    def unsupported_reason(self, layer_id: int, q, o, k_buffer, tree_rows, max_len_extend) -> str | None:
        staged = self.staged
        reuses = layer_id in self.skip_layers and self.workspace is not None  # the last layer's selection
        if (staged is None or staged.layer_id != layer_id) and not reuses:
            return f"DSA: no index query staged for layer {layer_id} (SGLang's indexer did not run)"
        if tree_rows is None:
            return "DSA: no compact tree visibility (needs patch 0004)"
        if k_buffer.shape[-1] != LATENT_DIM or kv_view(k_buffer).dtype not in (torch.bfloat16, torch.float16):
            return (f"DSA: the pool's rows are {k_buffer.dtype} x {k_buffer.shape[-1]} (served: 16-bit x "
                    f"{LATENT_DIM}; run with --kv-cache-dtype bfloat16)")
        if q.dim() != 3 or q.shape[-1] != LATENT_DIM or o.shape[-1] != LATENT_DIM - 64:
            return f"DSA: q {tuple(q.shape)} / o {tuple(o.shape)} (served: absorbed MLA, 576 / 512)"
        if not isinstance(max_len_extend, int) or max_len_extend < 1:
            return f"DSA: max_len_extend={max_len_extend!r}"
        return None

    def run(self, layer_id: int, q, o, k_buffer, kv_indptr, kv_indices, qo_indptr, tree_rows, max_len_extend: int,
            sm_scale: float) -> bool:
        """Serve one layer's verify into `o`; False (nothing written, counted) where it cannot."""
        reason = self.unsupported_reason(layer_id, q, o, k_buffer, tree_rows, max_len_extend)
        STATS.record(reason, (q.shape[1], q.shape[-1], o.shape[-1], str(q.dtype).removeprefix("torch."),
                              str(k_buffer.dtype).removeprefix("torch."), "dsa"))
        if reason is not None:
            self.staged = None
            return False
        staged = self.staged
        T, H, _ = q.shape
        bs = qo_indptr.shape[0] - 1
        if T == 0 or bs == 0:
            return True
        plan = self.plan(bs, max_len_extend, T)
        workspace = self.workspace
        if workspace is None or not workspace.fits(plan):
            workspace = self.workspace = DSAWorkspace(plan, q.device)  # eager only: captures reserve first
        index_buf = self.pool.get_index_k_with_scale_buffer(layer_id=layer_id)
        index_buf = index_buf.view(-1, INDEX_ROW_BYTES)
        out = o.view(T, H, -1)
        if staged is not None and staged.layer_id == layer_id:
            self.tree_slots = staged.tree_slots
            run_dsa_verify(plan, workspace, q, k_buffer, kv_indptr, kv_indices, qo_indptr, staged.tree_slots,
                           tree_rows, staged.index_q, staged.index_weights, index_buf, out, sm_scale=sm_scale)
            self.staged = None
        else:  # a layer that reuses the previous layer's selection (still in the workspace; or the dense shortcut)
            run_dsa_verify(plan, workspace, q, k_buffer, kv_indptr, kv_indices, qo_indptr, self.tree_slots, tree_rows,
                           None, None, index_buf, out, sm_scale=sm_scale, stages=("attention",))
        return True

    def prefill(self, layer_id: int, q, o, k_buffer, kv_indices, forward_batch, sm_scale: float) -> bool:
        """Serve one layer's extend (prefill) into `o` from the staged prompt queries: each request's keys are its
        cached prefix (kv_indices) then its new tokens (out_cache_loc). False (nothing written; SGLang's dense extend
        runs) where nothing is staged for the layer: every key is in the top k, or a layer reusing a selection."""
        staged, self.staged = self.staged, None
        if staged is None or staged.layer_id != layer_id:
            return False  # the indexer ranked nothing: every key of every request is in the top k
        reason = None
        if k_buffer.shape[-1] != LATENT_DIM or q.dim() != 3 or q.shape[-1] != LATENT_DIM:
            reason = f"q {tuple(q.shape)} over {k_buffer.shape[-1]}-wide rows (served: absorbed MLA, 576)"
        elif kv_view(k_buffer).dtype not in (torch.bfloat16, torch.float16):
            reason = f"a {k_buffer.dtype} cache (served: 16-bit)"
        elif forward_batch.extend_prefix_lens_cpu is None or forward_batch.extend_seq_lens_cpu is None:
            reason = "no host copy of the extend lengths"
        if reason is not None:
            if reason not in self._prefill_declined:
                self._prefill_declined.add(reason)
                logger.warning("ddtree-sm120: DSA prefill declined, SGLang's dense extend runs: %s", reason)
            return False
        if self._prefill is None:
            self._prefill = DSAPrefill(num_heads=self.heads, max_context=self.max_context, target=self.target,
                                       topk=self.topk, index_heads=self.index_heads)
        index_buf = self.pool.get_index_k_with_scale_buffer(layer_id=layer_id).view(-1, INDEX_ROW_BYTES)
        out = o.view(q.shape[0], q.shape[1], -1)
        prefix_start, start = 0, 0
        for prefix_len, extend_len in zip(forward_batch.extend_prefix_lens_cpu, forward_batch.extend_seq_lens_cpu,
                                          strict=True):
            prefix_len, extend_len = int(prefix_len), int(extend_len)
            end = start + extend_len
            slots = torch.cat([kv_indices[prefix_start:prefix_start + prefix_len], staged.tree_slots[start:end]])
            self._prefill.run(q[start:end], k_buffer, slots.to(torch.int64), prefix_len, staged.index_q[start:end],
                              staged.index_weights[start:end], index_buf, out[start:end], sm_scale=sm_scale)
            prefix_start += prefix_len
            start = end
        return True
