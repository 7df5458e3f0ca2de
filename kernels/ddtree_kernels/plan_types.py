"""The planning vocabulary: what a rule table is made of, a call's static shape, one launch, one kernel's entry.

A verify plan is the first rule of its GPU's table that matches the call (cache dtype, where the values live,
rows a request, key width) and whose kernels run on the target (the registry's `supports`), plus the split
count. A rule whose kernel does not run there (a Gluon tile under the interpreter, or with a Triton outside the
tested range) is skipped, so the rule after it is its fallback. There is no run-time autotuning: a verify call
is captured into a CUDA graph, so the choice is a pure function of static facts.

This module imports nothing of the package but `Target`: the registry, the rule tables and the launcher import
it, never the reverse; `describe` formats the tables.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from .target import Target

CACHES = ("16-bit", "fp8", "any")
VALUES = ("in keys", "apart", "any")


@dataclass(frozen=True)
class Tile:
    """One prefix kernel's tile and launch parameters."""

    kernel: str  # a registry name (registry.KERNELS)
    block_m: int  # rows (draft token x head) a program owns
    block_n: int  # keys a loop iteration loads
    num_warps: int
    num_stages: int
    # Programs of this tile an SM holds at once on the GPUs whose table has it; the split count fills
    # whole waves of them. The fit test checks it against the compiled kernel.
    programs_per_sm: int = 1
    # Score keys x rows (the key tile as the left operand) and gather the values apart from the keys:
    # for fp8 this keeps both gathers asynchronous.
    keys_major: bool = False
    # Knobs only one kernel reads, as (name, value) pairs (the Hopper tile: tail_partition).
    options: tuple[tuple[str, object], ...] = ()

    def option(self, name: str, default: object = None) -> object:
        return dict(self.options).get(name, default)

    def __str__(self) -> str:
        order = " keys-major" if self.keys_major else ""
        opts = "".join(f" {k}" if v is True else f" {k}={v}" for k, v in self.options)
        return (f"{self.kernel} {self.block_m}x{self.block_n}{order}, {self.num_warps} warps, {self.num_stages} "
                f"stages, {self.programs_per_sm} an SM{opts}")


@dataclass(frozen=True)
class Rule:
    """Calls this rule takes, and what they run."""

    cache: str  # CACHES: "16-bit" (bf16/fp16), "fp8" (e4m3) or "any"
    values: str  # VALUES: "in keys" (V is the keys' first D_V columns, SGLang's MLA pool), "apart" or "any"
    rows: tuple[int, int | None]  # rows a request (draft tokens x heads), inclusive; None: no upper bound
    tile: Tile
    # Rows past the last whole block, when at most tail_max_rows, run on `tail` in a second launch instead
    # of in a mostly empty block (GLM-5's 72 rows: two 32-row blocks and an 8-row tail).
    tail: Tile | None = None
    tail_max_rows: int = 0
    # Rows past the whole blocks spread over them, up to this many a block, in the same launch (a kernel
    # that takes a row tail on the key tiles it gathers anyway: registry `fused_tail_block_n`).
    fused_tail_max_rows: int = 0
    key_width_max: int | None = None  # keys (D_V + D_R) at most this wide: a draft model's narrow heads

    def __post_init__(self) -> None:
        if self.cache not in CACHES or self.values not in VALUES:
            raise ValueError(f"rule {self}: cache must be one of {CACHES}, values one of {VALUES}")
        if (self.tail is None) != (self.tail_max_rows == 0):
            raise ValueError(f"rule {self}: give a tail tile and tail_max_rows together")

    def matches(self, rows: int, *, kv_fp8: bool, v_from_k: bool, key_width: int) -> bool:
        """The call's cache and rows are this rule's (whether its kernels run there is the registry's)."""
        low, high = self.rows
        return (self.cache in ("any", "fp8" if kv_fp8 else "16-bit")
                and self.values in ("any", "in keys" if v_from_k else "apart")
                and low <= rows and (high is None or rows <= high)
                and (self.key_width_max is None or key_width <= self.key_width_max))

    def row_text(self) -> str:
        low, high = self.rows
        return f"{low}+" if high is None else f"{low}-{high}"


@dataclass(frozen=True)
class RuleTable:
    """One GPU family's rules, first match wins, and the launch parameters that are not per rule."""

    name: str
    rules: tuple[Rule, ...]
    tree: Tile  # the masked draft block (tree.py)
    # A merge program reads up to merge_block_d x merge_block_s partial values a step; the launcher trades
    # columns for parts to take every part in one step (launcher.merge_tile).
    merge_block_d: int = 32
    merge_block_s: int = 128
    merge_num_warps: int = 4
    max_splits: int = 512
    min_chunk: int = 128  # fewest prefix keys a split takes (short prefixes use fewer splits)
    # Prefetch each split's slot indices into L2 before its loop: each gather waits on them.
    prefetch_slots: bool = True
    # Launch every kernel after the tree kernel as a programmatic dependent of the one before it (sm_90+).
    pdl: bool = True

    def tiles(self) -> list[Tile]:
        """Every prefix tile the table can launch (fit compiles each of them)."""
        seen: list[Tile] = []
        for rule in self.rules:
            for tile in (rule.tile, rule.tail):
                if tile is not None and tile not in seen:
                    seen.append(tile)
        return seen


@dataclass(frozen=True)
class VerifyShape:
    """The static facts of a verify call that choose its kernels (CUDA-graph safe: no device values)."""

    batch_size: int
    num_heads: int
    max_draft_tokens: int
    total_tokens: int
    d_v: int = 512
    d_rope: int = 64
    kv_fp8: bool = False  # the cache is float8_e4m3fn
    v_from_k: bool = True  # values are the first d_v columns of the key rows (SGLang's MLA pool)

    @property
    def rows(self) -> int:
        """Rows (draft tokens x heads) of the longest request."""
        return self.max_draft_tokens * self.num_heads

    @property
    def key_width(self) -> int:
        return self.d_v + self.d_rope


# The constexprs a launch's description shows (Launch.tile).
_SHOWN = ("BLOCK_M", "TAIL_N", "BLOCK_N", "BLOCK_D", "BLOCK_S")


@dataclass(frozen=True)
class Launch:
    """One kernel launch of a plan (VerifyPlan.launches): what run_verify runs and fit compiles."""

    kernel: str  # a registry name (registry.KERNELS)
    grid: tuple[int, ...]
    constexprs: tuple[tuple[str, object], ...]  # fixed by the plan; the call adds the rest
    # (KernelEntry.call_constexprs)
    scalars: tuple[tuple[str, int], ...]  # runtime integers fixed by the plan (row_base, min_chunk, ...)
    num_warps: int
    num_stages: int
    programs_per_sm: int  # programs an SM the grid is sized for (0: not sized by residency)
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
        resident = f", {self.programs_per_sm} an SM" if self.programs_per_sm else ""
        return (f"{self.kernel:22} grid {self.grid!s:15} {self.tile}, {self.num_warps} warps, "
                f"{self.num_stages} stages{resident}")


@dataclass(frozen=True, eq=False)
class KernelEntry:
    """One kernel, as the planner, run_verify and fit know it.

    Its runtime arguments are its own parameter list (the non-constexpr parameters, in order), filled by
    name: run_verify has a value for every name any kernel uses, fit a type (registry.ARG_TYPES). So adding
    an argument takes the kernel's parameter and, if new, its value in run_verify and type in ARG_TYPES.
    """

    name: str
    fn: object | None  # the JIT function; None where the installed Triton does not build it (Gluon)
    supports: Callable[[Target, VerifyShape], bool]  # it serves this call on this target
    launch: Callable[..., Launch]  # builds its launch from a plan (prefix kernels: plan, tile, row_base, blocks)
    gluon: bool = False  # laid out for num_warps at trace time, pipelined by its own NUM_STAGES
    # Call-time constexpr values that fit compiles (the rest of a call's constexprs are fixed by the launch).
    compile_variants: tuple[tuple[tuple[str, object], ...], ...] = ((),)
    # The kernel takes rows past its whole blocks in the same pass, on this key-tile width (Rule.fused_tail_max_rows).
    fused_tail_block_n: int | None = None
    label: str = ""  # a short name in the fit report
    needs: str = ""  # what `supports` asks, in words (the rule table shows it)

    @cached_property
    def parameters(self) -> tuple[tuple[str, bool], ...]:
        """(name, is constexpr) of each parameter, in order (JIT or interpreted function alike)."""
        fn = getattr(self.fn, "fn", self.fn)
        params = inspect.signature(fn).parameters.values()
        return tuple((p.name, "constexpr" in str(p.annotation)) for p in params if p.name != "num_warps")

    @cached_property
    def runtime(self) -> tuple[str, ...]:
        """Its runtime arguments, in order."""
        return tuple(name for name, const in self.parameters if not const)

    @cached_property
    def constexpr_names(self) -> frozenset[str]:
        return frozenset(name for name, const in self.parameters if const)

    def call_constexprs(self, launch: Launch) -> tuple[str, ...]:
        """Constexprs the call supplies: the kernel's, less those the launch fixes."""
        fixed = {name for name, _ in launch.constexprs}
        return tuple(sorted(self.constexpr_names - fixed))
