"""Which rule table a target uses, and which rule of it a call takes.

    python -m ddtree_kernels.describe --table --gpu sm120    # a table, as `select` reads it
"""

from __future__ import annotations

from .hopper.rules import HOPPER
from .plan_types import Rule, RuleTable, VerifyShape
from .registry import KERNELS
from .sm120.rules import SM120
from .target import Target

# Chosen by compute capability. Anything not listed, and the interpreter, gets FALLBACK: sm_120's table,
# whose Triton tiles fit 99 KB a block on mma.sync, which every GPU runs.
TABLES: dict[str, RuleTable] = {"sm120": SM120, "sm90": HOPPER}
BY_CAPABILITY: dict[tuple[int, int], RuleTable] = {(12, 0): SM120, (9, 0): HOPPER}
FALLBACK = SM120


def table_for(target: Target) -> RuleTable:
    """The rule table planning uses on this target."""
    return BY_CAPABILITY.get(target.capability, FALLBACK) if target.capability is not None else FALLBACK


def capabilities_choosing(table: RuleTable) -> list[tuple[int, int]]:
    """Capabilities whose target uses `table`."""
    return sorted(cap for cap, chosen in BY_CAPABILITY.items() if chosen is table)


def runs(rule: Rule, target: Target, shape: VerifyShape) -> bool:
    """Every kernel the rule launches serves this call on this target."""
    return all(KERNELS[tile.kernel].supports(target, shape) for tile in (rule.tile, rule.tail) if tile is not None)


def select(table: RuleTable, shape: VerifyShape, target: Target) -> Rule:
    """The first rule of `table` that takes this call and whose kernels run on `target`."""
    for rule in table.rules:
        if rule.matches(shape.rows, kv_fp8=shape.kv_fp8, v_from_k=shape.v_from_k, key_width=shape.key_width) \
                and runs(rule, target, shape):
            return rule
    cache = "fp8" if shape.kv_fp8 else "16-bit"
    raise ValueError(f"no rule of table {table.name} takes a {cache} cache with values "
                     f"{'in keys' if shape.v_from_k else 'apart'}, {shape.rows} rows a request and keys "
                     f"{shape.key_width} wide on {target}: add one (a rule on prefix_general runs everywhere)")
