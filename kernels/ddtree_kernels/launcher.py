"""Plan and run one tree-verify attention call: prefix splits, tree block, merge.

Planning (`plan_verify`) looks only at static facts (shapes, the cache, the target), so the
same plan, grid and buffers serve every replay of a captured CUDA graph. Running
(`run_verify`) launches the tree kernel, the prefix kernel (one or two launches) and the
merge into caller-owned buffers and never reads a device value on the host. On sm_90 and
newer every launch after the tree kernel is a programmatic dependent of the one before it,
so its launch and prologue overlap the previous grid instead of following it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property, lru_cache

import torch
import triton

from .interpreter import interpreting
from .plan_types import KernelEntry, Launch, Rule, RuleTable, Tile, VerifyShape
from .registry import KERNELS
from .selection import select, table_for
from .target import Target, concrete_device


@dataclass(frozen=True)
class VerifyPlan:
    """Static launch decisions for one shape of verify call on one target: the rule it takes, the splits."""

    shape: VerifyShape
    target: Target
    table: RuleTable
    rule: Rule
    num_splits: int

    # The shape's facts, by name.
    batch_size = property(lambda self: self.shape.batch_size)
    num_heads = property(lambda self: self.shape.num_heads)
    max_draft_tokens = property(lambda self: self.shape.max_draft_tokens)
    total_tokens = property(lambda self: self.shape.total_tokens)
    d_v = property(lambda self: self.shape.d_v)
    d_rope = property(lambda self: self.shape.d_rope)
    kv_fp8 = property(lambda self: self.shape.kv_fp8)
    v_from_k = property(lambda self: self.shape.v_from_k)
    rows = property(lambda self: self.shape.rows)

    # Launch geometry is derived once per plan (plans are cached, frozen and replayed): on the host,
    # every verify call of an eager run pays for whatever run_verify recomputes.

    @cached_property
    def pdl(self) -> bool:
        """Programmatic dependent launch of every kernel after the first: the table asks, the target has it."""
        return self.table.pdl and self.target.pdl

    @cached_property
    def prefetch(self) -> bool:
        """Prefetch slot indices into L2 (PTX): the table asks and the kernels are compiled."""
        return self.table.prefetch_slots and not self.target.interpreted

    @property
    def prefix_tile(self) -> Tile:
        return self.rule.tile

    @cached_property
    def fused_tail_rows(self) -> int:
        """Rows past the whole blocks that each block takes in the same pass (Rule.fused_tail_max_rows; 0: none).
        They are spread over all the blocks: GLM-5's 72 rows are one block of 64 + 8, 264 four of 66."""
        return fused_tail_rows(self.rule, self.rows)

    def prefix_launches(self) -> tuple[tuple[Tile, int, int], ...]:
        """(tile, first row, row blocks) of each prefix launch: the rule's tile, then its row tail."""
        return self._prefix_launches

    @cached_property
    def _prefix_launches(self) -> tuple[tuple[Tile, int, int], ...]:
        return prefix_launches(self.rule, self.rows)

    @property
    def tail_rows(self) -> int:
        """Rows a request leaves to the second, row-tail launch (Rule.tail_max_rows)."""
        launches = self.prefix_launches()
        return self.rows - launches[1][1] if len(launches) > 1 else 0

    def dims(self, padded: bool = False) -> tuple[tuple[str, int], ...]:
        """The head and width constexprs (padded: with BLOCK_DV, BLOCK_DR, the widths as powers of two)."""
        dims = (("H", self.num_heads), ("D_V", self.d_v), ("D_R", self.d_rope))
        return dims + ((("BLOCK_DV", _pow2_at_least(self.d_v)), ("BLOCK_DR", _pow2_at_least(self.d_rope)))
                       if padded else ())

    @cached_property
    def merge_grid(self) -> tuple[tuple[int, int], int, int]:
        """(grid, BLOCK_D, BLOCK_S) of the merge launch."""
        block_d, block_s = merge_tile(self.table, self.num_parts)
        return (self.total_rows, _cdiv(self.d_v, block_d)), block_d, block_s

    @property
    def num_parts(self) -> int:
        """Prefix splits plus the tree block."""
        return self.num_splits + 1

    @property
    def total_rows(self) -> int:
        return self.total_tokens * self.num_heads

    def row_blocks(self, block_m: int) -> int:
        """Programs that cover the rows (draft tokens x heads) of the longest request."""
        return _cdiv(self.rows, block_m)

    def launches(self) -> tuple[Launch, ...]:
        """The kernels run_verify launches for this plan, in order: tree block, prefix, merge."""
        return self._launches

    @cached_property
    def _launches(self) -> tuple[Launch, ...]:
        prefix = [KERNELS[tile.kernel].launch(self, tile, row_base, blocks)
                  for tile, row_base, blocks in self.prefix_launches()]
        return (KERNELS["tree"].launch(self), *prefix, KERNELS["merge"].launch(self))

    @cached_property
    def steps(self) -> tuple[tuple[Launch, KernelEntry, tuple[str, ...]], ...]:
        """(launch, its kernel's entry, the constexprs the call supplies) of each launch, resolved once a plan:
        run_verify reads them on every call."""
        return tuple((launch, KERNELS[launch.kernel], KERNELS[launch.kernel].call_constexprs(launch))
                     for launch in self.launches())

    def describe(self) -> str:
        """One line for the plan, then one a launch: what a verify call of this shape runs."""
        cache = "fp8_e4m3" if self.kv_fp8 else "16-bit"
        number = self.table.rules.index(self.rule) + 1 if self.rule in self.table.rules else "custom"
        head = (f"verify plan: bs {self.batch_size}, {self.num_heads} heads x {self.max_draft_tokens} draft tokens "
                f"({self.rows} rows a request), {cache} cache, {self.num_splits} prefix splits, on {self.target}, "
                f"table {self.table.name} rule {number}, PDL {'on' if self.pdl else 'off'}")
        return "\n".join([head, *(f"  {i}. {launch}" for i, launch in enumerate(self.launches(), 1))])


def _cdiv(a: int, b: int) -> int:
    # Not triton.cdiv: on the host that is a JIT function call, several µs each.
    return -(-a // b)


def fused_tail_rows(rule: Rule, rows: int) -> int:
    """Rows past the rule's whole blocks that each block takes in the same pass, where its kernel does
    (registry `fused_tail_block_n`) and they are at most fused_tail_max_rows a block (0: none)."""
    tile = rule.tile
    if (not rule.fused_tail_max_rows or tile.keys_major or rows < tile.block_m
            or KERNELS[tile.kernel].fused_tail_block_n != tile.block_n):
        return 0
    blocks = rows // tile.block_m
    per_block = math.ceil((rows - blocks * tile.block_m) / blocks)
    return per_block if per_block <= rule.fused_tail_max_rows else 0


def prefix_launches(rule: Rule, rows: int) -> tuple[tuple[Tile, int, int], ...]:
    """(tile, first row, row blocks) of each prefix launch for requests of `rows` rows: the rule's tile, then
    the rows past its whole blocks on the tail tile when they are at most tail_max_rows, unless the tile's
    kernel takes them in its own blocks (`fused_tail_rows`)."""
    main = rule.tile
    if fused_tail_rows(rule, rows):
        return ((main, 0, rows // main.block_m),)
    tail = rows % main.block_m if rule.tail is not None and rows >= main.block_m else 0
    if not tail or tail > rule.tail_max_rows:
        return ((main, 0, _cdiv(rows, main.block_m)),)
    return ((main, 0, (rows - tail) // main.block_m), (rule.tail, rows - tail, _cdiv(tail, rule.tail.block_m)))


def split_count(programs_per_split: int, slots: int, max_splits: int, slack: float = 0.03) -> int:
    """Prefix splits for a grid of `programs_per_split` x splits programs on `slots` resident ones.

    A split's time is proportional to 1/splits, and the grid takes ceil(programs / slots) waves,
    so the cost is waves / splits. One program past a full wave doubles the time (265 programs
    on 264 slots). Among the split counts within `slack` of the best cost, take the fewest waves
    (fewer partial outputs to merge), then the most splits that still fit them: a wave filled to
    the last slot.
    """
    def waves(splits: int) -> int:
        return math.ceil(programs_per_split * splits / slots)

    candidates = range(1, max(1, max_splits) + 1)
    best = min(waves(s) / s for s in candidates)
    near = [s for s in candidates if waves(s) / s <= best * (1 + slack)]
    fewest = min(waves(s) for s in near)
    return max(s for s in near if waves(s) == fewest)


@lru_cache(maxsize=1024)  # a pure function of static arguments, asked on every verify call
def plan_verify(
    batch_size: int,
    num_heads: int,
    max_draft_tokens: int,
    total_tokens: int,
    target: Target | torch.device | str,
    *,
    d_v: int = 512,
    d_rope: int = 64,
    kv_fp8: bool = False,
    v_from_k: bool = True,
    num_splits: int | None = None,
    table: RuleTable | None = None,
) -> VerifyPlan:
    """The plan of a verify shape on a target (a device stands for `Target.detect(device)`).

    The rule is the first of the target's table (or `table`) that takes the call (`selection.select`); the
    split count fills whole waves of resident programs (`split_count`); at run time a short prefix uses fewer
    of them. `kv_fp8` and `v_from_k` describe the KV cache (`cache_layout`): run_verify checks them.
    """
    if batch_size < 1 or num_heads < 1 or max_draft_tokens < 1:
        raise ValueError(
            f"plan_verify needs batch_size, num_heads and max_draft_tokens >= 1, got "
            f"{batch_size}, {num_heads}, {max_draft_tokens}"
        )
    if not isinstance(target, Target):
        target = Target.detect(target)
    table = table or table_for(target)
    shape = VerifyShape(batch_size, num_heads, max_draft_tokens, total_tokens, d_v, d_rope, kv_fp8, v_from_k)
    rule = select(table, shape, target)
    if num_splits is None:
        # A row-tail launch runs beside the main one (it launches as soon as every main program has
        # started), on the SMs the main programs leave free. Count each program as its share of an SM,
        # so all launches fit one wave together: GLM-5's 72 rows at 88 splits put 88 wide programs and
        # 88 two-an-SM tail programs on 132 SMs.
        launches = prefix_launches(rule, shape.rows)
        shares = math.prod(tile.programs_per_sm for tile, _, _ in launches)
        per_split = sum(blocks * shares // tile.programs_per_sm for tile, _, blocks in launches) * batch_size
        num_splits = split_count(per_split, target.sms * shares, table.max_splits)
    return VerifyPlan(shape, target, table, rule, num_splits)


class Workspace:
    """Partial outputs and LSEs of the split prefix, owned by the caller.

    Flat buffers, viewed per plan as [rows, parts, d_v] and [rows, parts]: the largest
    batch has the most rows and the smallest the most splits, so sizing by the largest
    rows x parts product (not max rows x max parts) keeps one workspace small for every
    captured batch size. Size it once for the largest call and reuse it: a CUDA graph
    captures its addresses.
    """

    def __init__(self, part_rows: int, d_v: int, device: torch.device | str):
        self.d_v = d_v
        self.o_flat = torch.empty(part_rows * d_v, dtype=torch.float32, device=device)
        self.lse_flat = torch.empty(part_rows, dtype=torch.float32, device=device)

    @staticmethod
    def part_rows(plan: VerifyPlan) -> int:
        return plan.total_rows * plan.num_parts

    def fits(self, plan: VerifyPlan) -> bool:
        return self.part_rows(plan) <= self.lse_flat.numel() and plan.d_v <= self.d_v

    def views(self, plan: VerifyPlan) -> tuple[torch.Tensor, torch.Tensor]:
        """(o_part [rows, parts, d_v], lse_part [rows, parts]) for `plan`."""
        rows, parts = plan.total_rows, plan.num_parts
        return (self.o_flat[: rows * parts * plan.d_v].view(rows, parts, plan.d_v),
                self.lse_flat[: rows * parts].view(rows, parts))

    @classmethod
    def for_plan(cls, plan: VerifyPlan, device: torch.device | str) -> Workspace:
        return cls(cls.part_rows(plan), plan.d_v, device)

    @classmethod
    def for_plans(cls, plans: list[VerifyPlan], device: torch.device | str) -> Workspace:
        """One workspace that every plan given fits (a backend's, for each batch size it captures)."""
        return cls(max(cls.part_rows(p) for p in plans), max(p.d_v for p in plans), device)


def _scale_args(k_scale, v_scale) -> tuple[object, object, bool]:
    """Scales as two floats, or two 0-dim device tensors (read by the kernel: no sync)."""
    k_is_t, v_is_t = isinstance(k_scale, torch.Tensor), isinstance(v_scale, torch.Tensor)
    if not (k_is_t or v_is_t):
        return float(k_scale), float(v_scale), False
    device = (k_scale if k_is_t else v_scale).device

    def as_tensor(s):
        return s.reshape(()).to(torch.float32) if isinstance(s, torch.Tensor) else torch.full(
            (), float(s), dtype=torch.float32, device=device
        )

    return as_tensor(k_scale), as_tensor(v_scale), True


def kv_view(t: torch.Tensor) -> torch.Tensor:
    """SGLang may hand over an fp8 pool as raw bytes: view it as float8_e4m3fn."""
    return t.view(torch.float8_e4m3fn) if t.dtype == torch.uint8 else t


def values_in_keys(k_buf: torch.Tensor, v_buf: torch.Tensor) -> bool:
    """True when V is a view of the first columns of K (SGLang's MLA pool): one gather serves both."""
    return v_buf.data_ptr() == k_buf.data_ptr() and v_buf.stride(0) == k_buf.stride(0) and v_buf.dtype == k_buf.dtype


def cache_layout(k_buf: torch.Tensor, v_buf: torch.Tensor) -> tuple[bool, bool]:
    """(kv_fp8, v_from_k) of a KV cache, as `plan_verify` takes them."""
    k_buf, v_buf = kv_view(k_buf), kv_view(v_buf)
    return k_buf.dtype == torch.float8_e4m3fn, values_in_keys(k_buf, v_buf)


def _pow2_at_least(x: int, floor: int = 16) -> int:
    return max(floor, triton.next_power_of_2(max(x, 1)))


def merge_tile(conf: RuleTable, num_parts: int) -> tuple[int, int]:
    """(BLOCK_D, BLOCK_S) of a merge program: every part in one step where the register
    budget (merge_block_d x merge_block_s values) allows, narrowing the column slice to pay
    for it, down to 8 columns (one 32-byte sector a part)."""
    budget = conf.merge_block_d * conf.merge_block_s
    block_s = min(_pow2_at_least(num_parts), budget // 8)
    return max(8, min(conf.merge_block_d, budget // block_s)), block_s


def run_verify(
    plan: VerifyPlan,
    workspace: Workspace,
    q: torch.Tensor,  # [T, H, D_V + D_R]
    k_buf: torch.Tensor,  # [S, 1, D_V + D_R] (bf16/fp16 or float8_e4m3fn)
    v_buf: torch.Tensor,  # [S, 1, >= D_V]
    kv_indptr: torch.Tensor,  # [bs + 1]
    kv_indices: torch.Tensor,  # [>= kv_indptr[-1]]
    k_tree: torch.Tensor,  # [T, 1, D_V + D_R]
    v_tree: torch.Tensor,  # [T, 1, >= D_V]
    qo_indptr: torch.Tensor,  # [bs + 1]
    out: torch.Tensor,  # [T, H, D_V]
    *,
    mask_mode: int,
    mask: torch.Tensor | None,
    mask_indptr: torch.Tensor | None,
    mask_row_stride: int,
    sm_scale: float,
    k_scale=1.0,
    v_scale=1.0,
    lse_out: torch.Tensor | None = None,  # [T, H] float32, natural log
) -> None:
    """Run the plan's launches (VerifyPlan.launches): tree block, prefix splits, merge. No host synchronisation.

    With PDL (sm_90+) each launch after the tree kernel is a programmatic dependent of the one before
    it: it starts once every program there has started, runs beside it, and ends waiting for it, so
    the merge, waiting on the last prefix launch, sees every part."""
    if not workspace.fits(plan):
        raise ValueError(
            f"workspace holds {workspace.lse_flat.numel()} part rows of width {workspace.d_v} but the plan needs "
            f"{plan.total_rows} x {plan.num_parts} of width {plan.d_v}; allocate Workspace.for_plan(plan, device)"
        )
    if plan.target.interpreted != interpreting():
        raise ValueError(
            f"the plan was made for {plan.target} but kernels here run {'through' if interpreting() else 'outside'} "
            "Triton's interpreter (TRITON_INTERPRET): plan with Target.detect(device)"
        )
    k_s, v_s, scale_from_ptr = _scale_args(k_scale, v_scale)
    k_buf, v_buf = kv_view(k_buf), kv_view(v_buf)
    kv_fp8, v_from_k = cache_layout(k_buf, v_buf)
    if (kv_fp8, v_from_k) != (plan.kv_fp8, plan.v_from_k):
        raise ValueError(
            f"the plan was made for kv_fp8={plan.kv_fp8}, v_from_k={plan.v_from_k} but this call passes "
            f"kv_fp8={kv_fp8}, v_from_k={v_from_k}: call plan_verify(..., kv_fp8={kv_fp8}, v_from_k={v_from_k})"
        )
    o_part, lse_part = workspace.views(plan)
    # A value for every argument name any kernel takes; each launch passes its kernel's own (KernelEntry.runtime).
    values = dict(
        Q=q, K_buf=k_buf, V_buf=v_buf, kv_indices=kv_indices, qo_indptr=qo_indptr, kv_indptr=kv_indptr,
        K_tree=k_tree, V_tree=v_tree, O_part=o_part, LSE_part=lse_part, Out=out,
        LSE_out=lse_out if lse_out is not None else o_part,
        mask=mask if mask is not None else qo_indptr, mask_indptr=mask_indptr if mask_indptr is not None else qo_indptr,
        mask_row_stride=mask_row_stride, k_scale=k_s, v_scale=v_s, qk_scale_log2=sm_scale * 1.4426950408889634,
        stride_qt=q.stride(0), stride_qh=q.stride(1), stride_ks=k_buf.stride(0), stride_vs=v_buf.stride(0),
        stride_kt=k_tree.stride(0), stride_vt=v_tree.stride(0), stride_or=o_part.stride(0),
        stride_op=o_part.stride(1), stride_lr=lse_part.stride(0), stride_ot=out.stride(0), stride_oh=out.stride(1),
        stride_lse_t=lse_out.stride(0) if lse_out is not None else 0,
        # constexprs the call decides: the tree's mask layout, fp32 dots under the interpreter, scales as floats
        # or device tensors, whether the merge also writes the LSE
        MASK_MODE=mask_mode, DOT_FP32=plan.target.interpreted, SCALE_FROM_PTR=scale_from_ptr,
        STORE_LSE=lse_out is not None,
    )
    for launch, entry, call_constexprs in plan.steps:
        values.update(launch.scalars)
        # Gluon kernels pipeline by their NUM_STAGES constexpr; the tree kernel never waits on a grid.
        options = dict(num_warps=launch.num_warps, launch_pdl=plan.pdl and launch.kernel != "tree")
        if not entry.gluon:
            options["num_stages"] = launch.num_stages
        entry.fn[launch.grid](*[values[name] for name in entry.runtime], **launch.kwargs,
                              **{name: values[name] for name in call_constexprs}, **options)


# Workspaces handed out by `shared_workspace`, per device. A larger call allocates a
# larger one but the old ones stay referenced: a CUDA graph captured earlier keeps
# pointing at them, so they must never return to the allocator.
_WORKSPACES: dict[torch.device, list[Workspace]] = {}


def shared_workspace(plan: VerifyPlan, device: torch.device | str) -> Workspace:
    """The standalone API's workspace: process-wide, one a device, grown (never freed) to fit `plan`."""
    return reserve_workspace([plan], device)


def reserve_workspace(plans: list[VerifyPlan], device: torch.device | str) -> Workspace:
    """Grow the shared workspace up front (before CUDA-graph capture) to fit every plan given."""
    device = concrete_device(device)
    held = _WORKSPACES.setdefault(device, [])
    part_rows, d_v = max(Workspace.part_rows(p) for p in plans), max(p.d_v for p in plans)
    if held:
        if held[-1].lse_flat.numel() >= part_rows and held[-1].d_v >= d_v:
            return held[-1]
        part_rows, d_v = max(part_rows, held[-1].lse_flat.numel()), max(d_v, held[-1].d_v)
    held.append(Workspace(part_rows, d_v, device))
    return held[-1]
