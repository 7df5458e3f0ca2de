"""The plan decisions only the Gluon tiles use: where they run, how a wide block takes the row tail,
and which splits start late behind the tree kernel. `launcher.VerifyPlan` asks these."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..configs import VerifyConfig
from ..gluon_shared import unavailable_reason
from ..interpreter import interpreting
from . import prefix as prefix_hopper

if TYPE_CHECKING:
    from ..launcher import VerifyPlan


def gluon_supports(capability: tuple[int, int] | None, *, v_from_k: bool, d_v: int, d_rope: int) -> bool:
    """prefix_hopper's kernel serves this call: a Hopper GPU (wgmma), a Triton that builds it, a
    cache of any dtype (bf16/fp16, or fp8 widened in shared memory) with V read from K, D_V 512 and
    D_R 64, compiled (not interpreted)."""
    return (capability is not None and capability[0] == 9 and not interpreting()
            and not unavailable_reason() and v_from_k and d_v == 512 and d_rope == 64)


def fused_tail_rows(config: VerifyConfig, rows: int, *, kv_fp8: bool, v_from_k: bool, gluon: bool) -> int:
    """Rows past BLOCK_M that each row block of the Gluon wide kernel takes as its row tail, on the key
    tiles it gathers anyway, instead of a second launch reading the whole prefix again (0: none).

    The rows past the whole blocks are spread over all of them, at most configs.gluon_tail_max_rows
    a block: GLM-5's 72 rows are one block of 64 + 8, 144 two of 72, 264 four of 66.
    """
    main = config.prefix_for(rows, kv_fp8=kv_fp8, v_from_k=v_from_k, gluon=gluon)
    if not (gluon and main.gluon) or main.keys_major or main.block_n != 64 or rows < main.block_m:
        return 0
    blocks = rows // main.block_m
    per_block = math.ceil((rows - blocks * main.block_m) / blocks)
    return per_block if per_block <= config.gluon_tail_max_rows else 0


def gluon_rows(plan: VerifyPlan) -> tuple[int, int, int]:
    """(BLOCK_M, TAIL_N, rows a block owns) of prefix_hopper's kernel on the plan's main tile. A
    keys-major tile has no 64-row block: a request's rows (at most its block_m) are wgmma's N (TAIL_N,
    a power of two from 8), so decode's 8 rows do not pay for a tile sized for more. A wide tile's
    blocks each take their share of the rows past the whole blocks (`fused_tail_rows`) keys-major."""
    tile, rows = plan.prefix_tile, plan.max_draft_tokens * plan.num_heads
    if tile.keys_major:
        rows = min(rows, tile.block_m)  # one block a request
        return 0, prefix_hopper.keys_major_block(rows), rows
    tail = fused_tail_rows(plan.config, rows, kv_fp8=plan.kv_fp8, v_from_k=plan.v_from_k, gluon=plan.gluon)
    return tile.block_m, prefix_hopper.tail_block(tail), tile.block_m + tail


def tail_partition(plan: VerifyPlan) -> bool:
    """prefix_hopper's wide kernel runs its row tail on a warpgroup of its own (prefix_ws): a 16-bit
    cache, a 64-row block with a tail, and a config that asks for it."""
    block_m, tail_n, _ = plan.gluon_rows
    return (plan.gluon and plan.prefix_tile.gluon and plan.config.gluon_tail_partition and not plan.kv_fp8
            and block_m > 0 and tail_n > 0)


def split_reserve(plan: VerifyPlan) -> int:
    """Splits at the end of the grid whose programs start late: the tree kernel launches first and holds its
    SMs for a few key tiles' time, so the prefix programs launched last, as many as it has programs, wait
    that long for an SM, and with every split as long as the others the call waits for them. They get
    `late_keys` keys fewer each (`prefix_hopper._program_work`). Where the warp-specialized tile runs with
    PDL, at most 1/8 of the splits (else 0)."""
    tree_programs = plan.row_blocks(plan.config.tree.block_m) * plan.batch_size
    late = math.ceil(tree_programs / plan.prefix_launches()[0][2])  # the prefix programs of a split: its row blocks
    return late if plan.pdl and plan.tail_partition and late * 8 <= plan.num_splits else 0


def late_keys(plan: VerifyPlan) -> int:
    """Keys fewer for each of the last `split_reserve` splits than for the others."""
    return plan.config.late_split_tiles * plan.prefix_tile.block_n if plan.split_reserve else 0
