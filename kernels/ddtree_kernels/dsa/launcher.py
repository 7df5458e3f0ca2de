"""Plan and run one DSA tree-verify call: the indexer (its logits), the top-k (histogram, collect, resolve), sparse
MLA, merge; or, where every request's keys fit the top-k, the dense verify. The same
plan/run split as the dense verify (launcher.py): planning reads static facts only (shapes, the longest context, the
target), the workspace belongs to the caller and is sized once, and `run_dsa_verify` only launches kernels, so a
captured CUDA graph replays it with new prefixes, trees, slots and values.

Launches of a call: the indexer, a memset of the top-k state, histogram, collect, resolve, the sparse MLA and the
merge (seven). The dense shortcut: a gather of the tree's rows, then the dense
verify's own launches.

What each GPU family runs is one `DSATiles` entry (`DSA_TABLES`, chosen by compute capability like the dense rule
tables; a GPU without an entry, and the interpreter, take sm_120's, whose tiles fit its 99 KB).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

import torch

from ..interpreter import interpreting
from ..launcher import VerifyPlan, Workspace, _scale_args, kv_view, merge_tile, plan_verify, run_verify, split_count
from ..merge import merge_parts_kernel
from ..plan_types import Tile
from ..target import Target
from ..tree import MASK_COMPACT
from .index_keys import INDEX_DIM, index_views
from .indexer import dsa_index_logits_kernel
from .sparse_mla import dsa_sparse_mla_kernel
from .topk import STATE, dsa_topk_collect_kernel, dsa_topk_histogram_kernel, dsa_topk_resolve_kernel

TOPK = 2048  # GLM-5's index_topk
STAGES = ("indexer", "topk", "attention")  # attention: the sparse MLA and the merge
# A stage's kernels, each also a stage of its own (the sweep times them apart)
STAGE_KERNELS = {"indexer": ("indexer",), "topk": ("topk_histogram", "topk_collect", "topk_resolve"),
                 "attention": ("attention",)}


@dataclass(frozen=True)
class DSATiles:
    """One GPU family's DSA kernels: block_m is tokens a program (indexer) or heads a program (attention)."""

    name: str
    indexer: Tile  # block_m: tree tokens a program, each key tile read once for all of them; block_n: keys a tile
    topk: Tile  # the histogram and collect passes, many programs a token; block_n: logits a loop step
    topk_resolve: Tile  # resolve_splits programs a token; block_n: candidates (or logits, overflowed) a loop step
    attention: Tile  # block_m: heads a program, block_n: selected keys a step
    attention_fp8: Tile  # the same for an fp8 cache, widened in registers
    merge_block_d: int = 32
    merge_block_s: int = 128
    merge_num_warps: int = 4
    min_chunk: int = 256  # fewest keys an indexer or top-k split takes
    attention_min_chunk: int = 32
    # The top-k's candidate buffer a token, a fraction of its row rounded up to a power of two, within [min, max]
    # entries. The boundary bucket of normal logits holds about 9% of a row where the top-k is its top 10-25% (8k-20k
    # keys), 4% at the top 3% (64k), 2% at the top 1% (185k); a bucket that does not fit takes the exact fallback.
    candidates_fraction: float = 1 / 8
    candidates_min: int = 2048
    candidates_max: int = 16384


DSA_SM120 = DSATiles(
    "dsa-sm120",
    indexer=Tile("dsa_index_logits", block_m=16, block_n=128, num_warps=4, num_stages=3, programs_per_sm=2),
    topk=Tile("dsa_topk_collect", block_m=1, block_n=1024, num_warps=4, num_stages=1, programs_per_sm=8),
    topk_resolve=Tile("dsa_topk_resolve", block_m=1, block_n=1024, num_warps=8, num_stages=1),
    attention=Tile("dsa_sparse_mla", block_m=16, block_n=16, num_warps=4, num_stages=2),
    attention_fp8=Tile("dsa_sparse_mla", block_m=16, block_n=16, num_warps=4, num_stages=2),
)
DSA_TABLES: dict[tuple[int, int], DSATiles] = {(12, 0): DSA_SM120}


def dsa_tiles(target: Target) -> DSATiles:
    """The target's DSA_TABLES entry (sm_120's for a GPU without one, and for the interpreter)."""
    return DSA_TABLES.get(target.capability, DSA_SM120) if target.capability else DSA_SM120


@dataclass(frozen=True)
class DSAPlan:
    """Static launch decisions for one DSA verify shape on one target."""

    batch_size: int
    num_heads: int  # MLA query heads a GPU
    max_draft_tokens: int
    total_tokens: int
    max_context: int  # longest prefix a request may have: sizes the logits rows
    target: Target
    tiles: DSATiles
    topk: int = TOPK
    index_heads: int = 32
    d_v: int = 512
    d_rope: int = 64
    kv_fp8: bool = False
    candidates_override: int | None = None  # tests: a small buffer, to force its overflow

    @cached_property
    def logits_width(self) -> int:
        """Key positions a token's logits row holds: the longest prefix and the tree."""
        return self.max_context + self.max_draft_tokens

    @cached_property
    def dense_shortcut(self) -> bool:
        """Every request's visible keys fit the top-k (the longest prefix and the tree are at most `topk` keys), so
        each token's selection is all its keys and the dense tree verify computes the same attention: the plan runs
        it, with no indexer and no top-k. Decided from static facts only. Where the longest prefix is not known
        below the top-k (a server's plan), the check is per request on the GPU instead: the indexer skips a request
        whose keys all fit and the collect pass writes them (take-all)."""
        return self.logits_width <= self.topk

    @cached_property
    def dense_plan(self) -> VerifyPlan | None:
        """The dense verify's plan for the shortcut (None without it)."""
        if not self.dense_shortcut:
            return None
        return plan_verify(self.batch_size, self.num_heads, self.max_draft_tokens, self.total_tokens, self.target,
                           d_v=self.d_v, d_rope=self.d_rope, kv_fp8=self.kv_fp8)

    @cached_property
    def candidates(self) -> int:
        """The top-k's candidate buffer a token (entries)."""
        if self.candidates_override is not None:
            return self.candidates_override
        t = self.tiles
        want = max(t.candidates_min, int(self.logits_width * t.candidates_fraction))
        return min(t.candidates_max, 1 << (want - 1).bit_length())

    @cached_property
    def token_blocks(self) -> int:
        return -(-self.max_draft_tokens // self.tiles.indexer.block_m)

    @cached_property
    def attention_tile(self) -> Tile:
        return self.tiles.attention_fp8 if self.kv_fp8 else self.tiles.attention

    @cached_property
    def head_blocks(self) -> int:
        return -(-self.num_heads // self.attention_tile.block_m)

    @cached_property
    def index_splits(self) -> int:
        """The indexer's programs a token block (grid axis 1): key splits of the longest row, and where those leave
        the GPU's program slots idle, as many more as fill them (at most block_m a split) for the kernel to give
        groups of the block's tokens at run time; programs past the last group return at once (9 tokens on 8
        programs a split make 5 groups of 2)."""
        blocks = self.token_blocks * self.batch_size
        slots = self.target.sms * self.tiles.indexer.programs_per_sm
        splits = split_count(blocks, slots, max(1, -(-self.logits_width // self.tiles.min_chunk)))
        if splits * blocks >= slots:
            return splits
        return min(max(splits, slots // blocks), splits * self.tiles.indexer.block_m)

    @cached_property
    def topk_splits(self) -> int:
        return split_count(self.max_draft_tokens * self.batch_size, self.target.sms * self.tiles.topk.programs_per_sm,
                           max(1, -(-self.logits_width // self.tiles.topk.block_n)))

    @cached_property
    def resolve_splits(self) -> int:
        """The resolve's programs a token: a buffer's worth of blocks, at most 16 (a 185k row's boundary bucket holds
        up to ~12k candidates: 16 programs take one block each)."""
        return max(1, min(16, self.candidates // self.tiles.topk_resolve.block_n))

    @cached_property
    def attention_splits(self) -> int:
        return split_count(self.max_draft_tokens * self.head_blocks * self.batch_size, self.target.sms * 2,
                           max(1, self.topk // self.tiles.attention_min_chunk))

    @cached_property
    def merge(self) -> tuple[int, int]:
        """(BLOCK_D, BLOCK_S) of the merge."""
        return merge_tile(self.tiles, self.attention_splits)  # reads merge_block_d / merge_block_s

    def constexprs(self, kernel: str, *, interpreted: bool | None = None) -> dict[str, object]:
        """The constexprs and launch options (num_warps, num_stages) of one of the plan's kernels ("indexer",
        "topk_histogram", "topk" (the collect pass), "topk_resolve", "attention", "merge"): what run_dsa_verify
        launches and fit compiles."""
        dot_fp32 = self.target.interpreted if interpreted is None else interpreted
        tiles = self.tiles
        if kernel == "indexer":
            t = tiles.indexer
            hopper = self.target.capability is not None and self.target.capability[0] == 9
            return dict(HI=self.index_heads, D=INDEX_DIM, BLOCK_T=t.block_m, BLOCK_N=t.block_n, DOT_BF16=hopper,
                        DOT_FP32=dot_fp32, TOPK=self.topk, num_warps=t.num_warps, num_stages=t.num_stages)
        if kernel == "topk_histogram":  # the collect pass's grid and step
            t = tiles.topk
            return dict(TOPK=self.topk, BLOCK=t.block_n, num_warps=t.num_warps, num_stages=t.num_stages)
        if kernel in ("topk", "topk_resolve"):
            t = tiles.topk if kernel == "topk" else tiles.topk_resolve
            n_max = max(16, 1 << max(0, (self.max_draft_tokens - 1).bit_length()))
            return dict(TOPK=self.topk, CANDIDATES=self.candidates, N_MAX=n_max, BLOCK=t.block_n,
                        num_warps=t.num_warps, num_stages=t.num_stages)
        if kernel == "attention":
            t = self.attention_tile
            return dict(H=self.num_heads, D_V=self.d_v, D_R=self.d_rope, BLOCK_H=t.block_m, BLOCK_N=t.block_n,
                        HEAD_BLOCKS=self.head_blocks, WIDEN=self.kv_fp8, DOT_FP32=dot_fp32,
                        num_warps=t.num_warps, num_stages=t.num_stages)
        if kernel == "merge":
            block_d, block_s = self.merge
            return dict(H=self.num_heads, D_V=self.d_v, BLOCK_D=block_d, BLOCK_S=block_s, STORE_LSE=False,
                        USE_PDL=False, num_warps=tiles.merge_num_warps)
        raise ValueError(f"no DSA kernel {kernel!r}")

    @cached_property
    def launch_constexprs(self) -> dict[str, dict[str, object]]:
        """Each kernel's constexprs and options for this plan's target, resolved once: run_dsa_verify reads them on
        every call."""
        return {kernel: self.constexprs(kernel)
                for kernel in ("indexer", "topk_histogram", "topk", "topk_resolve", "attention", "merge")}

    def describe(self) -> str:
        cache = "fp8" if self.kv_fp8 else "16-bit"
        head = (f"DSA verify plan: bs {self.batch_size}, {self.num_heads} heads x {self.max_draft_tokens} draft "
                f"tokens, top {self.topk} of up to {self.max_context} + tree keys, {cache} cache, on {self.target}")
        if self.dense_shortcut:
            return f"{head}: every key fits the top-k, so the dense verify ({self.dense_plan.rule})"
        return (f"{head}, {self.tiles.name}: indexer {self.index_splits} splits ({self.tiles.indexer}), top-k collect "
                f"{self.topk_splits} splits and resolve {self.resolve_splits} ({self.candidates} candidates a token), "
                f"attention {self.attention_splits} splits ({self.attention_tile})")


def plan_dsa_verify(batch_size: int, num_heads: int, max_draft_tokens: int, total_tokens: int, max_context: int,
                    target: Target | torch.device | str, *, topk: int = TOPK, index_heads: int = 32,
                    d_v: int = 512, d_rope: int = 64, kv_fp8: bool = False,
                    candidates: int | None = None, tiles: DSATiles | None = None) -> DSAPlan:
    """The DSA plan of a verify shape on a target (a device stands for `Target.detect(device)`); `tiles` replaces the
    target's DSA_TABLES entry (ddtree_tools.sweep_dsa)."""
    if min(batch_size, num_heads, max_draft_tokens, topk, index_heads) < 1 or max_context < 0:
        raise ValueError("plan_dsa_verify needs batch_size, num_heads, max_draft_tokens, topk, index_heads >= 1 and "
                         f"max_context >= 0, got {batch_size}, {num_heads}, {max_draft_tokens}, {topk}, "
                         f"{index_heads}, {max_context}")
    if index_heads & (index_heads - 1):
        raise ValueError(f"index_heads must be a power of two (GLM-5: 32), got {index_heads}")
    if not isinstance(target, Target):
        target = Target.detect(target)
    if tiles is None:
        tiles = dsa_tiles(target)
    if candidates is not None and candidates < 1:
        raise ValueError(f"candidates must be >= 1, got {candidates}")
    return DSAPlan(batch_size, num_heads, max_draft_tokens, total_tokens, max_context, target, tiles, topk,
                   index_heads, d_v, d_rope, kv_fp8, candidates)


class DSAWorkspace:
    """The caller's buffers for DSA verify calls up to one plan's size: logits rows, top-k state and candidates, the
    selected slots and counts, the attention's partials, and for plans that take the dense shortcut the dense
    verify's workspace and the tree's rows. Allocate once (before CUDA-graph capture) and reuse."""

    def __init__(self, plan: DSAPlan, device: torch.device | str, *, splits: int | None = None,
                 candidates: int | None = None, dense: list[VerifyPlan] | None = None):
        tokens = plan.total_tokens
        splits = max(plan.attention_splits, splits or 0)
        candidates = max(plan.candidates, candidates or 0)
        self.plan_size = (tokens, plan.logits_width, plan.topk, plan.num_heads, splits, plan.d_v, candidates)
        self.logits = torch.empty((tokens, plan.logits_width), dtype=torch.float32, device=device)
        self.state = torch.zeros((tokens, STATE), dtype=torch.int32, device=device)
        # the candidates, then (the second half) those the resolve keeps
        self.cand_key = torch.empty((tokens, 2 * candidates), dtype=torch.int32, device=device)
        self.cand_slot = torch.empty((tokens, 2 * candidates), dtype=torch.int32, device=device)
        self.sel = torch.empty((tokens, plan.topk), dtype=torch.int32, device=device)
        self.sel_count = torch.empty(tokens, dtype=torch.int32, device=device)
        rows = tokens * plan.num_heads
        self.o_part = torch.empty((rows, splits, plan.d_v), dtype=torch.float32, device=device)
        self.lse_part = torch.empty((rows, splits), dtype=torch.float32, device=device)
        dense = [p for p in (dense or [])] + ([plan.dense_plan] if plan.dense_shortcut else [])
        self.dense = Workspace.for_plans(dense, device) if dense else None
        # the tree's latent rows, as bytes (a 16-bit or an fp8 cache's: viewed as the cache's dtype at run time)
        self.tree_rows = (torch.empty(max(p.total_tokens * (p.d_v + p.d_rope) for p in dense) * 2,
                                      dtype=torch.uint8, device=device) if dense else None)

    @classmethod
    def for_plans(cls, plans: list[DSAPlan], device: torch.device | str) -> DSAWorkspace:
        """One workspace that every plan given fits (a backend's, for each batch size it captures): the most
        tokens and the widest logits row, with as many partials a row as the plan that splits most."""
        largest = max(plans, key=lambda p: (p.total_tokens, p.logits_width))
        return cls(largest, device, splits=max(p.attention_splits for p in plans),
                   candidates=max(p.candidates for p in plans), dense=[p.dense_plan for p in plans if p.dense_shortcut])

    def fits(self, plan: DSAPlan) -> bool:
        tokens, width, topk, heads, splits, d_v, candidates = self.plan_size
        if plan.dense_shortcut:
            return (self.dense is not None and self.dense.fits(plan.dense_plan)
                    and plan.total_tokens * (plan.d_v + plan.d_rope) * 2 <= self.tree_rows.numel())
        return (plan.total_tokens <= tokens and plan.logits_width <= width and plan.topk == topk
                and plan.attention_splits <= splits and plan.d_v == d_v and plan.num_heads == heads
                and plan.candidates <= candidates)


_STAGE_NAMES = frozenset({*STAGE_KERNELS, *(k for ks in STAGE_KERNELS.values() for k in ks)})


@lru_cache(maxsize=64)  # asked on every call with one of a handful of tuples: no set building on the launch path
def _stage_kernels(stages: tuple[str, ...]) -> frozenset[str]:
    """The kernels `stages` (stage or kernel names) run; an unknown name is refused, naming the choices."""
    if unknown := set(stages) - _STAGE_NAMES:
        raise ValueError(f"unknown DSA stage {', '.join(sorted(unknown))}: choose from "
                         f"{', '.join(sorted(_STAGE_NAMES))}")
    return frozenset(k for stage in stages for k in STAGE_KERNELS.get(stage, (stage,)))


def run_dsa_verify(
    plan: DSAPlan,
    workspace: DSAWorkspace,
    q: torch.Tensor,  # [T, H, D_V + D_R] absorbed queries
    k_buf: torch.Tensor,  # [S, 1, D_V + D_R] latent rows (bf16/fp16 or float8_e4m3fn); the tree's rows at tree_slots
    kv_indptr: torch.Tensor,  # [bs + 1] prefix only
    kv_indices: torch.Tensor,  # [>= kv_indptr[-1]] slots
    qo_indptr: torch.Tensor,  # [bs + 1]
    tree_slots: torch.Tensor,  # [T] each draft token's slot (its latent row and index key)
    visibility: torch.Tensor,  # [T, >= n] uint8/bool: ancestors and itself
    index_q: torch.Tensor,  # [T, HI, 128] float8_e4m3fn
    index_weights: torch.Tensor,  # [T, HI] float32
    index_buf: torch.Tensor,  # [S, 132] uint8, SGLang's page-size-1 index buffer
    out: torch.Tensor,  # [T, H, D_V]
    *,
    sm_scale: float,
    k_scale=1.0,
    stages: tuple[str, ...] = STAGES,
) -> None:
    """Indexer, top-k, sparse MLA, merge into `out` (the dense verify where the plan takes its shortcut). No host
    synchronisation: graph-safe.

    `stages`: a subset of STAGES (or of a stage's kernels, STAGE_KERNELS) to run alone (the benchmarks time each; a
    stage reads what the one before it left in the workspace). A dense-shortcut plan runs the dense verify for any
    of them."""
    kernels = _stage_kernels(tuple(stages))
    if not workspace.fits(plan):
        raise ValueError(f"the DSA workspace was sized for {workspace.plan_size} (tokens, logits width, topk, heads, "
                         "splits, d_v, candidates): allocate DSAWorkspace(plan, device) for this plan")
    if plan.target.interpreted != interpreting():
        raise ValueError(f"the plan was made for {plan.target}; plan with Target.detect(device) here")
    k_buf = kv_view(k_buf)
    if (k_buf.dtype == torch.float8_e4m3fn) != plan.kv_fp8:
        raise ValueError(f"the plan was made for kv_fp8={plan.kv_fp8}: plan_dsa_verify(..., kv_fp8="
                         f"{k_buf.dtype == torch.float8_e4m3fn})")
    if visibility.dtype == torch.bool:
        visibility = visibility.view(torch.uint8)
    if plan.dense_shortcut:
        _run_dense(plan, workspace, q, k_buf, kv_indptr, kv_indices, qo_indptr, tree_slots, visibility, out,
                   sm_scale=sm_scale, k_scale=k_scale)
        return
    if "indexer" in kernels and (index_q.shape[-1] != INDEX_DIM or index_q.shape[1] != plan.index_heads):
        raise ValueError(f"index_q must be [T, {plan.index_heads}, {INDEX_DIM}], got {tuple(index_q.shape)}")
    index_k, index_s = index_views(index_buf)
    bs, tiles = plan.batch_size, plan.tiles
    ws = workspace
    if "indexer" in kernels:
        dsa_index_logits_kernel[(plan.token_blocks, plan.index_splits, bs)](
            index_q, index_weights, index_k, index_s, kv_indices, kv_indptr, qo_indptr, tree_slots, visibility,
            ws.logits, tiles.min_chunk,
            index_q.stride(0), index_q.stride(1), index_weights.stride(0), index_k.stride(0), index_s.stride(0),
            visibility.stride(0), ws.logits.stride(0), **plan.launch_constexprs["indexer"],
        )
    if "topk_histogram" in kernels:
        ws.state.zero_()  # the bucket histograms and the counters the passes add to (one memset)
        dsa_topk_histogram_kernel[(plan.max_draft_tokens, plan.topk_splits, bs)](
            ws.logits, ws.state, kv_indptr, qo_indptr, tiles.min_chunk, ws.logits.stride(0), ws.state.stride(0),
            **plan.launch_constexprs["topk_histogram"],
        )
    if "topk_collect" in kernels:
        dsa_topk_collect_kernel[(plan.max_draft_tokens, plan.topk_splits, bs)](
            ws.logits, ws.state, ws.sel, ws.cand_key, ws.cand_slot, kv_indices, kv_indptr, qo_indptr, tree_slots,
            visibility, tiles.min_chunk, ws.logits.stride(0), ws.state.stride(0), ws.sel.stride(0),
            ws.cand_key.stride(0), visibility.stride(0), **plan.launch_constexprs["topk"],
        )
    if "topk_resolve" in kernels:
        dsa_topk_resolve_kernel[(plan.max_draft_tokens, plan.resolve_splits, bs)](
            ws.logits, ws.state, ws.sel, ws.sel_count, ws.cand_key, ws.cand_slot, kv_indices, kv_indptr, qo_indptr,
            tree_slots, visibility, ws.logits.stride(0), ws.state.stride(0), ws.sel.stride(0), ws.cand_key.stride(0),
            visibility.stride(0), **plan.launch_constexprs["topk_resolve"],
        )
    if "attention" not in kernels:
        return
    k_s, _, scale_from_ptr = _scale_args(k_scale, k_scale)
    splits = plan.attention_splits
    o_part = ws.o_part[: plan.total_tokens * plan.num_heads]
    lse_part = ws.lse_part[: plan.total_tokens * plan.num_heads]
    dsa_sparse_mla_kernel[(plan.max_draft_tokens * plan.head_blocks, splits, bs)](
        q, k_buf, ws.sel, ws.sel_count, qo_indptr, o_part, lse_part,
        k_s, sm_scale * 1.4426950408889634, tiles.attention_min_chunk,
        q.stride(0), q.stride(1), k_buf.stride(0), ws.sel.stride(0), o_part.stride(0), o_part.stride(1),
        lse_part.stride(0), SCALE_FROM_PTR=scale_from_ptr, **plan.launch_constexprs["attention"],
    )
    merge_parts_kernel[(plan.total_tokens * plan.num_heads, -(-plan.d_v // plan.merge[0]))](
        o_part, lse_part, out, o_part, qo_indptr, bs, splits,
        o_part.stride(0), o_part.stride(1), lse_part.stride(0), out.stride(0), out.stride(1), 0,
        **plan.launch_constexprs["merge"],
    )


def _run_dense(plan: DSAPlan, ws: DSAWorkspace, q, k_buf, kv_indptr, kv_indices, qo_indptr, tree_slots, visibility,
               out, *, sm_scale: float, k_scale) -> None:
    """The dense tree verify over the same keys (every one of them is selected): the tree's rows gathered from the
    pool into the workspace (one launch), then the dense plan's launches."""
    if tree_slots is None:
        raise ValueError("the dense shortcut needs tree_slots (the tree's rows in the pool)")
    T, width = q.shape[0], k_buf.shape[-1]
    rows = ws.tree_rows[: T * width * k_buf.element_size()].view(k_buf.dtype).view(T, 1, width)
    torch.index_select(k_buf, 0, tree_slots[:T], out=rows)
    run_verify(plan.dense_plan, ws.dense, q, k_buf, k_buf[..., : plan.d_v], kv_indptr, kv_indices, rows,
               rows[..., : plan.d_v], qo_indptr, out, mask_mode=MASK_COMPACT, mask=visibility, mask_indptr=None,
               mask_row_stride=visibility.stride(0), sm_scale=sm_scale, k_scale=k_scale, v_scale=k_scale)


def dsa_tree_verify(q, k_buf, kv_indptr, kv_indices, qo_indptr, tree_slots, visibility, index_q, index_weights,
                    index_buf, *, sm_scale: float, max_context: int | None = None, topk: int = TOPK,
                    k_scale=1.0, out: torch.Tensor | None = None) -> torch.Tensor:
    """One DSA tree verify, planned and with its own workspace (for tests and one-off use; a server plans once and
    keeps a DSAWorkspace). max_context: the longest prefix to size for (default: read from kv_indptr, a host
    sync)."""
    bs = qo_indptr.shape[0] - 1
    counts = (qo_indptr[1:] - qo_indptr[:-1])
    if max_context is None:
        max_context = int((kv_indptr[1:] - kv_indptr[:-1]).max()) if bs else 0
    d_v = 512 if out is None else out.shape[-1]
    plan = plan_dsa_verify(bs, q.shape[1], int(counts.max()) if bs else 1, q.shape[0], max_context, q.device,
                           topk=topk, index_heads=index_q.shape[1], d_v=d_v, d_rope=q.shape[-1] - d_v,
                           kv_fp8=kv_view(k_buf).dtype == torch.float8_e4m3fn)
    out = torch.empty((q.shape[0], q.shape[1], d_v), dtype=q.dtype, device=q.device) if out is None else out
    run_dsa_verify(plan, DSAWorkspace(plan, q.device), q, k_buf, kv_indptr, kv_indices, qo_indptr, tree_slots,
                   visibility, index_q, index_weights, index_buf, out, sm_scale=sm_scale, k_scale=k_scale)
    return out


# What fit compiles for each DSA kernel: the function and its runtime arguments' types ("*KV": the cache's dtype).
DSA_KERNELS = {
    "indexer": (dsa_index_logits_kernel, dict(
        IQ="*fp8e4nv", IW="*fp32", index_k="*fp8e4nv", index_s="*fp32", kv_indices="*i64", kv_indptr="*i32",
        qo_indptr="*i32", tree_slots="*i64", vis="*u8", Logits="*fp32", min_chunk="i32",
        stride_iqt="i32", stride_iqh="i32", stride_iwt="i32", stride_ik="i32", stride_is="i32", stride_vis="i32",
        stride_lt="i32")),
    "topk_histogram": (dsa_topk_histogram_kernel, dict(
        Logits="*fp32", State="*i32", kv_indptr="*i32", qo_indptr="*i32", min_chunk="i32", stride_lt="i32",
        stride_st="i32")),
    "topk": (dsa_topk_collect_kernel, dict(
        Logits="*fp32", State="*i32", Sel="*i32", CandKey="*i32", CandSlot="*i32", kv_indices="*i64",
        kv_indptr="*i32", qo_indptr="*i32", tree_slots="*i64", vis="*u8", min_chunk="i32", stride_lt="i32",
        stride_st="i32", stride_selt="i32", stride_ct="i32", stride_vis="i32")),
    "topk_resolve": (dsa_topk_resolve_kernel, dict(
        Logits="*fp32", State="*i32", Sel="*i32", SelCount="*i32", CandKey="*i32", CandSlot="*i32",
        kv_indices="*i64", kv_indptr="*i32", qo_indptr="*i32", tree_slots="*i64", vis="*u8", stride_lt="i32",
        stride_st="i32", stride_selt="i32", stride_ct="i32", stride_vis="i32")),
    "attention": (dsa_sparse_mla_kernel, dict(
        Q="*bf16", K_buf="*KV", Sel="*i32", SelCount="*i32", qo_indptr="*i32", O_part="*fp32", LSE_part="*fp32",
        k_scale="fp32", qk_scale_log2="fp32", min_chunk="i32", stride_qt="i32", stride_qh="i32", stride_ks="i32",
        stride_selt="i32", stride_or="i32", stride_op="i32", stride_lr="i32")),
}
