"""How a plan launches Hopper's wgmma tile: its row split, its row-tail partition and its late splits.

The registry's `hopper_wgmma` entry (`ENTRIES`) calls `wgmma_launch`; nothing in the core reads this module
otherwise. The plan is any object with VerifyPlan's attributes (no import of the launcher).
"""

from __future__ import annotations

import math

from ..plan_types import KernelEntry, Launch, Tile, VerifyShape
from ..target import Target
from . import prefix_wgmma, prefix_wgmma_ws

# Key tiles fewer for each split whose programs start late, behind the tree kernel's: the tree kernel holds
# its SMs about three key tiles' time of the 64 x 64 tile.
LATE_SPLIT_TILES = 3


def wgmma_supports(target: Target, shape: VerifyShape) -> bool:
    """A Hopper GPU, a Triton that builds the Gluon tile, compiled; values in the keys, D_V 512, D_R 64 (a
    16-bit cache, or fp8 widened in shared memory)."""
    return (target.compiled_gluon and target.capability is not None and target.capability[0] == 9
            and shape.v_from_k and shape.d_v == 512 and shape.d_rope == 64)


def wgmma_rows(plan, tile: Tile) -> tuple[int, int, int]:
    """(BLOCK_M, TAIL_N, rows a block owns). A keys-major tile has no 64-row block: a request's rows (at most
    its block_m) are wgmma's N (TAIL_N, a power of two from 8). A wide tile's blocks each take their share of
    the rows past the whole blocks (VerifyPlan.fused_tail_rows) keys-major."""
    if tile.keys_major:
        rows = min(plan.rows, tile.block_m)  # one block a request
        return 0, prefix_wgmma.keys_major_block(rows), rows
    tail = plan.fused_tail_rows
    return tile.block_m, prefix_wgmma.tail_block(tail), tile.block_m + tail


def tail_partition(plan, tile: Tile) -> bool:
    """The row tail runs on a warpgroup of its own (prefix_wgmma_ws): the tile asks for it, a 16-bit cache, a
    64-row block with a tail."""
    block_m, tail_n, _ = wgmma_rows(plan, tile)
    return bool(tile.option("tail_partition")) and not plan.kv_fp8 and block_m > 0 and tail_n > 0


def split_reserve(plan, tile: Tile, row_blocks: int) -> int:
    """Splits at the end of the grid whose programs start late: the tree kernel launches first and holds its
    SMs for a few key tiles' time, so the prefix programs launched last, as many as it has programs, wait that
    long for an SM. They get `late_keys` keys fewer each. Where the warp-specialized tile runs with PDL, at most
    1/8 of the splits (else 0)."""
    tree_programs = plan.row_blocks(plan.table.tree.block_m) * plan.batch_size
    late = math.ceil(tree_programs / row_blocks)  # the prefix programs of a split: its row blocks
    return late if plan.pdl and tail_partition(plan, tile) and late * 8 <= plan.num_splits else 0


def wgmma_launch(plan, tile: Tile, row_base: int, row_blocks: int) -> Launch:
    block_m, tail_n, row_stride = wgmma_rows(plan, tile)
    ws = tail_partition(plan, tile)
    reserve = split_reserve(plan, tile, row_blocks)
    late_keys = LATE_SPLIT_TILES * tile.block_n if reserve else 0
    return Launch(
        kernel="hopper_wgmma_ws" if ws else "hopper_wgmma", grid=(row_blocks, plan.num_splits, plan.batch_size),
        constexprs=(*plan.dims(), ("BLOCK_M", block_m), ("BLOCK_N", tile.block_n), ("NUM_STAGES", tile.num_stages),
                    ("TAIL_N", tail_n), ("KV_FP8", plan.kv_fp8), ("USE_PDL", plan.pdl)),
        scalars=(("min_chunk", plan.table.min_chunk), ("split_reserve", reserve), ("late_keys", late_keys),
                 ("row_base", row_base), ("row_stride", row_stride)),
        num_warps=prefix_wgmma_ws.KERNEL_WARPS if ws else tile.num_warps, num_stages=tile.num_stages,
        programs_per_sm=tile.programs_per_sm, row_base=row_base, note="(wgmma)")


_VARIANTS = ((("SCALE_FROM_PTR", False),),)
ENTRIES = (
    KernelEntry("hopper_wgmma", getattr(prefix_wgmma, "prefix_wgmma_kernel", None), wgmma_supports, wgmma_launch,
                gluon=True, compile_variants=_VARIANTS, fused_tail_block_n=64, label="prefix_wgmma",
                needs="sm_90, Gluon, compiled, V in K, D 512+64"),
    # Chosen by hopper_wgmma's launch, never by a rule (tail_partition); it takes the same arguments.
    KernelEntry("hopper_wgmma_ws", getattr(prefix_wgmma_ws, "prefix_wgmma_ws_kernel", None), wgmma_supports,
                wgmma_launch, gluon=True, compile_variants=_VARIANTS, label="prefix_wgmma_ws"),
)
