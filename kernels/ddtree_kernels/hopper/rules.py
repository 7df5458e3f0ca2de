"""Hopper's (sm_90) kernel-selection table. First matching rule whose kernel runs on the target wins.

227 KB a block. Where the Gluon wgmma tile runs (a Triton in gluon_shared.TESTED_TRITON, values in the
keys, D_V 512, D_R 64): up to 16 rows take its keys-major form (the rows are wgmma's N, so decode does
not pay for a 64-row block); from 17 rows its 64 x 64 tile, one block with the missing rows masked
below 64, and past whole blocks up to 8 rows a block in those blocks (GLM-5's 72 rows: one block of 64 +
8), for a 16-bit cache on a warpgroup of its own (`tail_partition`, prefix_wgmma_ws.py). Elsewhere
prefix_general.py's tiles, two 16-row programs an SM, and 64-row ones from 64 rows.
"""

from __future__ import annotations

from ..plan_types import Rule, RuleTable, Tile

_GENERAL_16 = Tile("prefix_general", 16, 32, 4, 3, programs_per_sm=2)
_GENERAL_16_FP8 = Tile("prefix_general", 16, 32, 4, 3, programs_per_sm=2, keys_major=True)

HOPPER = RuleTable(
    name="sm90",
    rules=(
        Rule("16-bit", "in keys", (1, 16), Tile("hopper_wgmma", 16, 64, 4, 2, keys_major=True)),
        Rule("fp8", "in keys", (1, 16), Tile("hopper_wgmma", 16, 64, 4, 2, programs_per_sm=2, keys_major=True)),
        Rule("16-bit", "in keys", (17, None), Tile("hopper_wgmma", 64, 64, 8, 2, options=(("tail_partition", True),)),
             tail=_GENERAL_16, tail_max_rows=32, fused_tail_max_rows=8),
        Rule("fp8", "in keys", (17, None), Tile("hopper_wgmma", 64, 64, 8, 2),
             tail=_GENERAL_16_FP8, tail_max_rows=32, fused_tail_max_rows=8),
        Rule("16-bit", "in keys", (64, None), Tile("prefix_general", 64, 64, 8, 2), tail=_GENERAL_16,
             tail_max_rows=32),
        Rule("fp8", "any", (64, None), Tile("prefix_general", 64, 32, 8, 2, keys_major=True), tail=_GENERAL_16_FP8,
             tail_max_rows=32),
        Rule("16-bit", "in keys", (1, None), _GENERAL_16),
        Rule("fp8", "any", (1, None), _GENERAL_16_FP8),
        Rule("16-bit", "apart", (1, None), Tile("prefix_general", 128, 64, 8, 2), key_width_max=128),
        Rule("16-bit", "apart", (1, None), Tile("prefix_general", 32, 16, 8, 2)),
    ),
    tree=Tile("tree", 32, 32, 8, 1, programs_per_sm=0),
    merge_block_d=32,
    merge_block_s=256,
)
