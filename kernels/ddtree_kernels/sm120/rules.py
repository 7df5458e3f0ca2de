"""sm_120's kernel-selection table. First matching rule whose kernel runs on the target wins.

One program an SM for every tile but fp8 decode's: a 32-key tile of 576-wide rows in two stages takes
most of the 99 KB. Requests of 64+ rows take 32-row blocks (GLM-5's 72 rows: two of them and an 8-row
tail on the 16-row tile, each key tile read three times instead of five). fp8 decode (up to 16 rows)
takes a 16-key tile, two programs an SM, one's widening hidden behind the other's. Where the Gluon tile
does not run, the rule after it takes the call with the same rows a program and programs an SM, so the
split count and row blocks are the same: the chunked tl.dot tiles for 16 bits, the keys-major ones for
fp8 (widened in registers; 8 warps keep them spill-free). The DFlash drafter's narrow heads (keys of 128
in their own V buffer) take a 128-row block of 64-key tiles.
"""

from __future__ import annotations

import dataclasses

from ..plan_types import Rule, RuleTable, Tile

_LATENT_16 = Tile("prefix_latent_split", 16, 32, 8, 2)
_LATENT_32 = Tile("prefix_latent_split", 32, 32, 8, 2)
_LATENT_FP8_16 = Tile("prefix_latent_split_fp8", 16, 32, 8, 2)
_LATENT_FP8_32 = Tile("prefix_latent_split_fp8", 32, 32, 8, 2)
_CHUNKED_16 = Tile("prefix_chunked", 16, 64, 4, 2)
_CHUNKED_32 = Tile("prefix_chunked", 32, 32, 8, 2)
_FP8_16 = Tile("prefix_general", 16, 32, 8, 3, keys_major=True)

SM120 = RuleTable(
    name="sm120",
    rules=(
        Rule("fp8", "in keys", (1, 16), Tile("prefix_latent_split_fp8", 16, 16, 8, 2, programs_per_sm=2)),
        Rule("fp8", "in keys", (1, 16), Tile("prefix_general", 16, 16, 4, 2, programs_per_sm=2, keys_major=True)),
        Rule("16-bit", "in keys", (64, None), _LATENT_32, tail=_LATENT_16, tail_max_rows=32),
        Rule("16-bit", "in keys", (64, None), _CHUNKED_32, tail=_CHUNKED_16, tail_max_rows=32),
        Rule("16-bit", "in keys", (1, None), _LATENT_16),
        Rule("16-bit", "in keys", (1, None), _CHUNKED_16),
        # Key widths the chunked tile's dots cannot take (D_V / 4 and D_R powers of two of at least 16).
        Rule("16-bit", "in keys", (64, None), Tile("prefix_general", 32, 32, 8, 2),
             tail=Tile("prefix_general", 16, 64, 4, 2), tail_max_rows=32),
        Rule("16-bit", "in keys", (1, None), Tile("prefix_general", 16, 64, 4, 2)),
        Rule("fp8", "in keys", (64, None), _LATENT_FP8_32, tail=_LATENT_FP8_16, tail_max_rows=32),
        Rule("fp8", "any", (64, None), Tile("prefix_general", 32, 16, 8, 3, keys_major=True), tail=_FP8_16,
             tail_max_rows=32),
        Rule("fp8", "in keys", (1, None), _LATENT_FP8_16),
        Rule("fp8", "any", (1, None), _FP8_16),
        Rule("16-bit", "apart", (1, None), Tile("prefix_general", 128, 64, 8, 2), key_width_max=128),
        Rule("16-bit", "apart", (1, None), Tile("prefix_general", 32, 16, 8, 2)),
    ),
    tree=Tile("tree", 32, 32, 8, 1, programs_per_sm=0),
    merge_block_d=32,
    merge_block_s=128,
)

# Opt-in, selected by no target: an fp8 cache in keys on the e4m3 MMA (sm120/prefix_latent_split_e4m3.py), to be
# measured on a GPU that runs that instruction (sm_89+; the H200 rewrites it into fp16 MMAs). `fit` compiles it;
# `bench --table sm120-e4m3` times it. Two query passes (the default) leave a 16-row tile 154 registers: one an SM.
SM120_E4M3 = dataclasses.replace(SM120, name="sm120-e4m3", rules=(
    Rule("fp8", "in keys", (64, None), Tile("prefix_latent_split_e4m3", 32, 32, 8, 2),
         tail=Tile("prefix_latent_split_e4m3", 16, 32, 8, 2), tail_max_rows=32),
    Rule("fp8", "in keys", (1, None), Tile("prefix_latent_split_e4m3", 16, 32, 8, 2)),
    *SM120.rules,
))
