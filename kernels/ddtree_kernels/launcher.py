"""Plan and run one tree-verify attention call: prefix splits, tree block, merge.

Planning (`plan_verify`) looks only at static facts (shapes, the device), so the
same plan, grid and buffers serve every replay of a captured CUDA graph. Running
(`run_verify`) launches the tree kernel, the prefix kernel (one or two launches) and the
merge into caller-owned buffers and never reads a device value on the host. On sm_90 and
newer every launch after the tree kernel is a programmatic dependent of the one before it,
so its launch and prologue overlap the previous grid instead of following it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache, cached_property, lru_cache

import torch
import triton

from . import prefix_mma_v2
from .configs import TileConfig, VerifyConfig, config_for, config_name
from .hopper import plan as hopper_plan
from .hopper import prefix as prefix_hopper
from .hopper import prefix_ws as prefix_hopper_ws
from .hopper.plan import fused_tail_rows, gluon_supports
from .interpreter import interpreting
from .merge import merge_parts_kernel
from .prefix import prefix_split_kernel
from .prefix_chunked import prefix_chunked_kernel
from .tree import tree_block_kernel

_EMULATED_CAPABILITY: tuple[int, int] | None = None


def emulate_capability(capability: tuple[int, int] | None) -> None:
    """Plan every call as if the GPU had this compute capability, keeping its own SM count; None undoes it.

    This is sm_120 emulation on another GPU (the benchmark's and the GPU suite's EMULATE=sm120): the
    configuration, tiles and programs an SM that sm_120 gets, grids sized for the GPU at hand. Pair it
    with DISABLE_MMA_V3=1, so Triton lowers every dot to mma.sync as on sm_120."""
    global _EMULATED_CAPABILITY
    _EMULATED_CAPABILITY = tuple(capability) if capability is not None else None
    plan_verify.cache_clear()


@cache
def _real_device_facts(device: torch.device) -> tuple[tuple[int, int] | None, int]:
    if device.type != "cuda":
        return None, 4  # the interpreter: a few "SMs" so CPU tests still split the prefix
    props = torch.cuda.get_device_properties(device)
    return (props.major, props.minor), props.multi_processor_count


def _device_facts(device: torch.device) -> tuple[tuple[int, int] | None, int]:
    """(compute capability, SM count) that plans are made for: the device's, or the emulated capability."""
    capability, sm_count = _real_device_facts(device)
    if _EMULATED_CAPABILITY is not None and capability is not None:
        capability = _EMULATED_CAPABILITY
    return capability, sm_count


# The constexprs a launch's description shows (Launch.tile).
_SHOWN = ("BLOCK_M", "TAIL_N", "BLOCK_N", "BLOCK_D", "BLOCK_S")


@dataclass(frozen=True)
class Launch:
    """One kernel launch of a plan (VerifyPlan.launches): what run_verify runs and fit compiles."""

    kernel: str  # a key of KERNELS
    grid: tuple[int, ...]
    constexprs: tuple[tuple[str, object], ...]  # fixed by the plan; the call adds CALL_CONSTEXPRS
    num_warps: int
    num_stages: int
    ctas_per_sm: int  # programs an SM the grid is sized for (0: not sized by residency)
    row_base: int = 0  # prefix launches: the first row (of each request) this launch covers
    note: str = ""  # how it computes, for the description

    @property
    def tile(self) -> str:
        """The constexprs that shape it, as text."""
        shown = dict(self.constexprs)
        rows = f"rows {self.row_base}+ " if self.kernel.startswith(("prefix", "hopper")) else ""
        text = " ".join(f"{k} {shown[k]}" for k in _SHOWN if k in shown)
        return f"{rows}{text}{' keys-major' if shown.get('KEYS_MAJOR') else ''}{f' {self.note}' if self.note else ''}"

    @cached_property
    def kwargs(self) -> dict[str, object]:
        """The constexprs as keyword arguments (built once: run_verify passes them on every call)."""
        return dict(self.constexprs)

    def __str__(self) -> str:
        resident = f", {self.ctas_per_sm} an SM" if self.ctas_per_sm else ""
        return (f"{self.kernel:42} grid {self.grid!s:15} {self.tile}, {self.num_warps} warps, "
                f"{self.num_stages} stages{resident}")


KERNELS = {
    "tree_block_kernel": tree_block_kernel,
    "prefix_split_kernel": prefix_split_kernel,
    "prefix_chunked_kernel": prefix_chunked_kernel,
    "prefix_mma_v2_kernel": getattr(prefix_mma_v2, "prefix_mma_v2_kernel", None),
    # Defined where the installed Triton builds Gluon kernels (gluon_shared.unavailable_reason); plans
    # elsewhere never launch them.
    "hopper.prefix.prefix_wide_hopper_kernel": getattr(prefix_hopper, "prefix_wide_hopper_kernel", None),
    "hopper.prefix_ws.prefix_wide_ws_kernel": getattr(prefix_hopper_ws, "prefix_wide_ws_kernel", None),
    "merge_parts_kernel": merge_parts_kernel,
}
# Kernels written in Gluon: laid out for num_warps at trace time, pipelined by their own code.
GLUON_KERNELS = frozenset(name for name in KERNELS if name.startswith("hopper.") or name == "prefix_mma_v2_kernel")
# Constexprs each call supplies (not the plan): the tree's mask layout, a scale passed as a float or a
# device tensor, fp32 dots under the interpreter, whether the merge also writes the LSE.
CALL_CONSTEXPRS = {
    "tree_block_kernel": ("MASK_MODE", "DOT_FP32"),
    "prefix_split_kernel": ("SCALE_FROM_PTR", "DOT_FP32"),
    "prefix_chunked_kernel": ("SCALE_FROM_PTR", "DOT_FP32"),
    "prefix_mma_v2_kernel": ("SCALE_FROM_PTR",),
    "hopper.prefix.prefix_wide_hopper_kernel": ("SCALE_FROM_PTR",),
    "hopper.prefix_ws.prefix_wide_ws_kernel": ("SCALE_FROM_PTR",),
    "merge_parts_kernel": ("STORE_LSE",),
}


@dataclass(frozen=True)
class VerifyPlan:
    """Static launch decisions for one shape of verify call."""

    batch_size: int
    num_heads: int
    max_draft_tokens: int
    total_tokens: int
    d_v: int
    d_rope: int
    num_splits: int
    config: VerifyConfig
    kv_fp8: bool = False  # the cache is float8_e4m3fn (the fp8 prefix tile)
    v_from_k: bool = True  # values are the first d_v columns of the key rows (SGLang's MLA pool)
    pdl: bool = False  # programmatic dependent launch of every kernel after the first (uses_pdl)
    gluon: bool = False  # tiles marked `gluon` run prefix_hopper's kernel (gluon_supports)

    # Launch geometry is derived once per plan (plans are cached, frozen and replayed): on the
    # host, every verify call of an eager run pays for whatever run_verify recomputes.

    @property
    def prefix_tile(self) -> TileConfig:
        return self.config.prefix_for(self.max_draft_tokens * self.num_heads, kv_fp8=self.kv_fp8,
                                      v_from_k=self.v_from_k, gluon=self.gluon, key_width=self.d_v + self.d_rope)

    @property
    def tail_rows(self) -> int:
        """Rows a request leaves to the second, narrow-tile prefix launch (configs.wide_tail_max_rows)."""
        return self.config.tail_rows(self.max_draft_tokens * self.num_heads, kv_fp8=self.kv_fp8,
                                     v_from_k=self.v_from_k, gluon=self.gluon, key_width=self.d_v + self.d_rope)

    def prefix_launches(self) -> tuple[tuple[TileConfig, int, int], ...]:
        """(tile, first row, row blocks) of each prefix launch: the main tile, then the row tail."""
        return self._prefix_launches

    @cached_property
    def _prefix_launches(self) -> tuple[tuple[TileConfig, int, int], ...]:
        return prefix_launches(self.config, self.max_draft_tokens * self.num_heads, kv_fp8=self.kv_fp8,
                               v_from_k=self.v_from_k, gluon=self.gluon, key_width=self.d_v + self.d_rope)

    # The Gluon tiles' own decisions (hopper/plan.py), derived once per plan.

    @cached_property
    def gluon_rows(self) -> tuple[int, int, int]:
        return hopper_plan.gluon_rows(self)

    @cached_property
    def tail_partition(self) -> bool:
        return hopper_plan.tail_partition(self)

    @cached_property
    def split_reserve(self) -> int:
        return hopper_plan.split_reserve(self)

    @cached_property
    def late_keys(self) -> int:
        return hopper_plan.late_keys(self)

    @cached_property
    def head_blocks(self) -> tuple[int, int]:
        """(BLOCK_DV, BLOCK_DR): the value and rope widths padded to powers of two."""
        return _pow2_at_least(self.d_v), _pow2_at_least(self.d_rope)

    @cached_property
    def merge_grid(self) -> tuple[tuple[int, int], int, int]:
        """(grid, BLOCK_D, BLOCK_S) of the merge launch."""
        block_d, block_s = merge_tile(self.config, self.num_parts)
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
        return _cdiv(self.max_draft_tokens * self.num_heads, block_m)

    def launches(self) -> tuple[Launch, ...]:
        """The kernels run_verify launches for this plan, in order."""
        return self._launches

    @cached_property
    def _launches(self) -> tuple[Launch, ...]:
        conf, tc, pdl = self.config, self.config.tree, self.pdl
        block_dv, block_dr = self.head_blocks
        dims = dict(H=self.num_heads, D_V=self.d_v, D_R=self.d_rope)
        padded = dict(dims, BLOCK_DV=block_dv, BLOCK_DR=block_dr)
        prefetch = conf.prefetch_slots and not interpreting()  # the interpreter runs no PTX
        out = [Launch("tree_block_kernel", (self.row_blocks(tc.block_m), self.batch_size),
                      _items(padded, BLOCK_M=tc.block_m, BLOCK_N=tc.block_n, USE_PDL=pdl),
                      tc.num_warps, tc.num_stages, 0)]
        for tile, row_base, row_blocks in self.prefix_launches():
            runs_mma_v2 = self.mma_v2(tile)
            if tile.mma_v2 and not runs_mma_v2 and tile.fallback is not None:
                tile = tile.fallback
            grid = (row_blocks, self.num_splits, self.batch_size)
            if tile.gluon and self.gluon:
                block_m, tail_n, _ = self.gluon_rows
                ws = self.tail_partition
                out.append(Launch("hopper.prefix_ws.prefix_wide_ws_kernel" if ws else
                                  "hopper.prefix.prefix_wide_hopper_kernel", grid,
                                  _items(dims, BLOCK_M=block_m, BLOCK_N=tile.block_n, NUM_STAGES=tile.num_stages,
                                         TAIL_N=tail_n, KV_FP8=self.kv_fp8, USE_PDL=pdl),
                                  prefix_hopper_ws.KERNEL_WARPS if ws else tile.num_warps, tile.num_stages,
                                  tile.ctas_per_sm, row_base, "(wgmma)"))
            elif runs_mma_v2:
                out.append(Launch("prefix_mma_v2_kernel", grid,
                                  _items(dims, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, KV_FP8=self.kv_fp8,
                                         USE_PDL=pdl),
                                  tile.num_warps, tile.num_stages, tile.ctas_per_sm, row_base,
                                  "(Gluon mma.sync, latent split)"))
            elif self.chunked(tile):
                out.append(Launch("prefix_chunked_kernel", grid,
                                  _items(dims, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, PREFETCH_L2=prefetch,
                                         USE_PDL=pdl),
                                  tile.num_warps, tile.num_stages, tile.ctas_per_sm, row_base,
                                  "(tl.dot, 4 score chains)"))
            else:
                out.append(Launch("prefix_split_kernel", grid,
                                  _items(padded, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, V_FROM_K=self.v_from_k,
                                         WIDEN_TO_FP16=self.kv_fp8, PREFETCH_L2=prefetch, USE_PDL=pdl,
                                         KEYS_MAJOR=tile.keys_major),
                                  tile.num_warps, tile.num_stages, tile.ctas_per_sm, row_base, "(tl.dot)"))
        grid, block_d, block_s = self.merge_grid
        out.append(Launch("merge_parts_kernel", grid,
                          _items(dict(H=self.num_heads, D_V=self.d_v), BLOCK_D=block_d, BLOCK_S=block_s, USE_PDL=pdl),
                          conf.merge_num_warps, 1, 0))
        return tuple(out)

    def mma_v2(self, tile: TileConfig) -> bool:
        """This prefix tile runs prefix_mma_v2_kernel (TileConfig.mma_v2, where it applies)."""
        return tile.mma_v2 and not interpreting() and prefix_mma_v2.supports(
            v_from_k=self.v_from_k, d_v=self.d_v, d_rope=self.d_rope)

    def chunked(self, tile: TileConfig) -> bool:
        """This prefix tile runs prefix_chunked_kernel (TileConfig.chunked, where it applies)."""
        return tile.chunked and chunked_supported(kv_fp8=self.kv_fp8, v_from_k=self.v_from_k, d_v=self.d_v,
                                                   d_rope=self.d_rope)

    def describe(self) -> str:
        """One line for the plan, then one a launch: what a verify call of this shape runs."""
        cache = "fp8_e4m3" if self.kv_fp8 else "16-bit"
        head = (f"verify plan: bs {self.batch_size}, {self.num_heads} heads x {self.max_draft_tokens} draft tokens "
                f"({self.max_draft_tokens * self.num_heads} rows a request), {cache} cache, {self.num_splits} "
                f"prefix splits, config {config_name(self.config)}, PDL {'on' if self.pdl else 'off'}")
        return "\n".join([head, *(f"  {i}. {launch}" for i, launch in enumerate(self.launches(), 1))])


def _items(base: dict, **more) -> tuple[tuple[str, object], ...]:
    return tuple({**base, **more}.items())


def _cdiv(a: int, b: int) -> int:
    # Not triton.cdiv: on the host that is a JIT function call, several µs each.
    return -(-a // b)


def prefix_launches(config: VerifyConfig, rows: int, *, kv_fp8: bool, v_from_k: bool,
                    gluon: bool = False, key_width: int = 576) -> tuple[tuple[TileConfig, int, int], ...]:
    """(tile, first row, row blocks) of each prefix launch for requests of `rows` rows: the main
    tile, then the row tail on the narrow tile (configs.wide_tail_max_rows) unless the main tile's
    Gluon kernel spreads it over its blocks (`fused_tail_rows`)."""
    main = config.prefix_for(rows, kv_fp8=kv_fp8, v_from_k=v_from_k, gluon=gluon, key_width=key_width)
    tail = config.tail_rows(rows, kv_fp8=kv_fp8, v_from_k=v_from_k, gluon=gluon, key_width=key_width)
    if fused_tail_rows(config, rows, kv_fp8=kv_fp8, v_from_k=v_from_k, gluon=gluon):
        return ((main, 0, rows // main.block_m),)
    if not tail:
        return ((main, 0, _cdiv(rows, main.block_m)),)
    narrow = config.narrow_for(kv_fp8=kv_fp8)
    return ((main, 0, (rows - tail) // main.block_m), (narrow, rows - tail, _cdiv(tail, narrow.block_m)))


def chunked_supported(*, kv_fp8: bool, v_from_k: bool, d_v: int, d_rope: int) -> bool:
    """prefix_chunked_kernel serves this cache: 16-bit, values read from the key rows, D_V / 4 and D_R
    powers of two of at least 16 (its dots' shapes)."""
    def pow2(x: int) -> bool:
        return x >= 16 and x & (x - 1) == 0

    return not kv_fp8 and v_from_k and d_v % 4 == 0 and pow2(d_v // 4) and pow2(d_rope)


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
    device: torch.device | str,
    *,
    d_v: int = 512,
    d_rope: int = 64,
    num_splits: int | None = None,
    config: VerifyConfig | None = None,
    kv_fp8: bool = False,
    v_from_k: bool = True,
    gpu: tuple[tuple[int, int], int] | None = None,
) -> VerifyPlan:
    """Choose the split count and tile configuration for a verify shape.

    The split count fills whole waves of resident programs (`split_count`); at run
    time a short prefix uses fewer of them. `kv_fp8` and `v_from_k` describe the KV
    cache (`cache_layout`): they pick the prefix tile, and `run_verify` checks them.
    `gpu` = (compute capability, SM count) plans for a GPU other than `device`'s (describe.py).
    """
    if batch_size < 1 or num_heads < 1 or max_draft_tokens < 1:
        raise ValueError(
            f"plan_verify needs batch_size, num_heads and max_draft_tokens >= 1, got "
            f"{batch_size}, {num_heads}, {max_draft_tokens}"
        )
    capability, sm_count = gpu if gpu is not None else _device_facts(torch.device(device))
    config = config or config_for(capability)
    gluon = gluon_supports(capability, v_from_k=v_from_k, d_v=d_v, d_rope=d_rope)
    if num_splits is None:
        # A row-tail launch runs beside the main one (it launches as soon as every main program
        # has started), on the SMs the main programs leave free. Count each program as its share
        # of an SM, so all launches fit one wave together: GLM-5's 72 rows at 88 splits put 88
        # wide programs and 88 two-an-SM tail programs on 132 SMs.
        launches = prefix_launches(config, max_draft_tokens * num_heads, kv_fp8=kv_fp8, v_from_k=v_from_k,
                                   gluon=gluon, key_width=d_v + d_rope)
        shares = math.prod(tile.ctas_per_sm for tile, _, _ in launches)
        per_split = sum(blocks * shares // tile.ctas_per_sm for tile, _, blocks in launches) * batch_size
        num_splits = split_count(per_split, sm_count * shares, config.max_splits)
    return VerifyPlan(batch_size, num_heads, max_draft_tokens, total_tokens, d_v, d_rope, num_splits, config,
                      kv_fp8, v_from_k, uses_pdl(config, capability), gluon)


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


def merge_tile(conf: VerifyConfig, num_parts: int) -> tuple[int, int]:
    """(BLOCK_D, BLOCK_S) of a merge program: every part in one step where the register
    budget (merge_block_d x merge_block_s values) allows, narrowing the column slice to pay
    for it, down to 8 columns (one 32-byte sector a part)."""
    budget = conf.merge_block_d * conf.merge_block_s
    block_s = min(_pow2_at_least(num_parts), budget // 8)
    return max(8, min(conf.merge_block_d, budget // block_s)), block_s


def uses_pdl(conf: VerifyConfig, capability: tuple[int, int] | None) -> bool:
    """Programmatic dependent launch for every kernel after the first: sm_90 and newer, not
    under the interpreter (it runs no PTX). plan_verify records it in the plan."""
    return conf.pdl and capability is not None and capability >= (9, 0) and not interpreting()


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
    k_s, v_s, scale_from_ptr = _scale_args(k_scale, v_scale)
    k_buf, v_buf = kv_view(k_buf), kv_view(v_buf)
    kv_fp8, v_from_k = cache_layout(k_buf, v_buf)
    if (kv_fp8, v_from_k) != (plan.kv_fp8, plan.v_from_k):
        raise ValueError(
            f"the plan was made for kv_fp8={plan.kv_fp8}, v_from_k={plan.v_from_k} but this call passes "
            f"kv_fp8={kv_fp8}, v_from_k={v_from_k}: call plan_verify(..., kv_fp8={kv_fp8}, v_from_k={v_from_k})"
        )
    o_part, lse_part = workspace.views(plan)
    parts = (o_part, lse_part)
    part_strides = (o_part.stride(0), o_part.stride(1), lse_part.stride(0))
    qk_scale_log2 = sm_scale * 1.4426950408889634
    call = dict(MASK_MODE=mask_mode, DOT_FP32=interpreting(), SCALE_FROM_PTR=scale_from_ptr,
                STORE_LSE=lse_out is not None)
    # Positional arguments of each kernel, in its signature's order.
    prefix_common = (qo_indptr, kv_indptr, *parts, k_s, v_s, qk_scale_log2, plan.config.min_chunk)
    for launch in plan.launches():
        name = launch.kernel
        if name == "tree_block_kernel":
            args = (q, k_tree, v_tree, qo_indptr, kv_indptr, mask if mask is not None else qo_indptr,
                    mask_indptr if mask_indptr is not None else qo_indptr, *parts, qk_scale_log2, plan.num_splits,
                    mask_row_stride, q.stride(0), q.stride(1), k_tree.stride(0), v_tree.stride(0), *part_strides)
        elif name == "prefix_split_kernel":
            args = (q, k_buf, v_buf, kv_indices, *prefix_common, launch.row_base,
                    q.stride(0), q.stride(1), k_buf.stride(0), v_buf.stride(0), *part_strides)
        elif name in ("prefix_chunked_kernel", "prefix_mma_v2_kernel"):
            args = (q, k_buf, kv_indices, *prefix_common, launch.row_base,
                    q.stride(0), q.stride(1), k_buf.stride(0), *part_strides)
        elif name.startswith("hopper."):
            args = (q, k_buf, kv_indices, *prefix_common, plan.split_reserve, plan.late_keys, launch.row_base,
                    plan.gluon_rows[2], q.stride(0), q.stride(1), k_buf.stride(0), *part_strides)
        else:  # merge_parts_kernel
            args = (*parts, out, lse_out if lse_out is not None else o_part, qo_indptr, plan.batch_size,
                    plan.num_parts, *part_strides, out.stride(0), out.stride(1),
                    lse_out.stride(0) if lse_out is not None else 0)
        # Gluon kernels pipeline by their NUM_STAGES constexpr; the tree kernel never waits on a grid.
        options = dict(num_warps=launch.num_warps, launch_pdl=plan.pdl and name != "tree_block_kernel")
        if name not in GLUON_KERNELS:
            options["num_stages"] = launch.num_stages
        KERNELS[name][launch.grid](*args, **launch.kwargs, **{k: call[k] for k in CALL_CONSTEXPRS[name]},
                                   **options)


# Workspaces handed out by `shared_workspace`, per device. A larger call allocates a
# larger one but the old ones stay referenced: a CUDA graph captured earlier keeps
# pointing at them, so they must never return to the allocator.
_WORKSPACES: dict[torch.device, list[Workspace]] = {}


def shared_workspace(plan: VerifyPlan, device: torch.device | str) -> Workspace:
    """A process-wide workspace that fits `plan`, grown (never freed) as needed."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    held = _WORKSPACES.setdefault(device, [])
    if held and held[-1].fits(plan):
        return held[-1]
    part_rows = max(held[-1].lse_flat.numel() if held else 0, Workspace.part_rows(plan))
    grown = Workspace(part_rows, max(held[-1].d_v if held else 0, plan.d_v), device)
    held.append(grown)
    return grown


def reserve_workspace(plans: list[VerifyPlan], device: torch.device | str) -> Workspace:
    """Allocate the shared workspace up front (before CUDA-graph capture) for every plan given."""
    part_rows = max(Workspace.part_rows(p) for p in plans)
    plan = VerifyPlan(1, 1, 1, part_rows, max(p.d_v for p in plans), 0, 0, plans[0].config)
    return shared_workspace(plan, device)
