"""What a kernel-selection table is made of: tiles, rules, and a GPU family's table.

A verify plan is the first rule of its GPU's table that matches the call (cache dtype, where
the values live, rows a request, key width) and whose kernels run on the target (the
registry's `supports`), plus the split count. A rule whose kernel does not run there (a
Gluon tile under the interpreter, or with a Triton outside the tested range) is skipped, so
the rule after it is its fallback. There is no run-time autotuning: a verify call is
captured into a CUDA graph, so the choice is a pure function of static facts.
"""

from __future__ import annotations

from dataclasses import dataclass

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

    def lines(self, number: int) -> list[str]:
        """The rule as table lines: its match, its tile and what that kernel needs, its row tails."""
        from .registry import KERNELS  # the registry imports these types

        needs = KERNELS[self.tile.kernel].needs
        extra = f" (keys <= {self.key_width_max})" if self.key_width_max else ""
        out = [f"{number:>3}. {self.cache:7} {self.values:8} {self.row_text():6} {self.tile}{extra}"
               f"{f'  [needs {needs}]' if needs else ''}"]
        if self.fused_tail_max_rows:
            out.append(f"{'':29}rows past whole blocks: up to {self.fused_tail_max_rows} a block, in them")
        if self.tail is not None:
            out.append(f"{'':29}then up to {self.tail_max_rows} tail rows: {self.tail}")
        return out


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

    def table(self) -> str:
        """The rules as text, in order: what `describe --table` prints."""
        lines = [f"{self.name}: the first rule that matches the call and whose kernel runs on the target",
                 f"{'#':>4} {'cache':7} {'values':8} {'rows':6} prefix tile"]
        for number, rule in enumerate(self.rules, 1):
            lines += rule.lines(number)
        return "\n".join(lines)
