"""What a plan is made of: the call's static shape, one kernel's registry entry, one launch."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from .target import Target


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
    constexprs: tuple[tuple[str, object], ...]  # fixed by the plan; the call adds the rest (call_constexprs)
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

    @cached_property
    def call_constexprs(self) -> tuple[str, ...]:
        """The kernel's constexprs this launch leaves to the call (registry.KernelEntry.call_constexprs)."""
        from .registry import KERNELS

        return KERNELS[self.kernel].call_constexprs(self)

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
