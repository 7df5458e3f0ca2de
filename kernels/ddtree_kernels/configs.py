"""Launch configurations, per GPU architecture, and the rule that admits them.

There is no run-time autotuning: a verify call is captured into a CUDA graph, so
the configuration must be a pure function of static facts (architecture, shapes).
Every configuration here is compiled offline for sm_120 and sm_90 by the fit test
(`python -m ddtree_kernels.fit`), which fails on one that does not fit.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

# Shared memory a block may use (bytes), by compute capability.
SHARED_MEMORY_LIMIT = {(12, 0): 101_376, (9, 0): 232_448, (8, 0): 166_912, (8, 9): 101_376}
SM120_SHARED_MEMORY = SHARED_MEMORY_LIMIT[(12, 0)]
# Shared memory of a whole SM (bytes): how many programs can be resident at once.
SHARED_MEMORY_PER_SM = {(12, 0): 102_400, (9, 0): 233_472, (8, 0): 167_936, (8, 9): 102_400}


@dataclass(frozen=True)
class TileConfig:
    """One kernel's tile shape and launch parameters."""

    block_m: int  # rows (draft token x head) a program owns
    block_n: int  # keys a loop iteration loads
    num_warps: int
    num_stages: int
    # Programs of this tile an SM holds at once (registers and shared memory allow), on the
    # targets that choose it; the split count fills whole waves of them. The fit test checks
    # it against the compiled kernel (`python -m ddtree_kernels.fit`).
    ctas_per_sm: int = 2
    # Prefix tiles: score keys x rows (the key tile as the left operand, untransposed) and gather
    # the values apart from the keys. For fp8 this keeps both gathers asynchronous (one 8-bit tile
    # feeding two differently laid out operands is loaded synchronously by Triton's pipeliner).
    keys_major: bool = False
    # The wide Hopper tile written in Gluon (prefix_hopper.py) instead of prefix.py's: taken on sm_90
    # where the installed Triton runs it (prefix_hopper.TESTED_TRITON) and V is read from K, D_V 512,
    # D_R 64; prefix.py's kernel runs the same bf16 tile everywhere else (for fp8:
    # VerifyConfig.prefix_wide_fp8_gluon, with prefix_wide_fp8 everywhere else).
    gluon: bool = False


@dataclass(frozen=True)
class VerifyConfig:
    """Everything the launcher needs to pick for one architecture."""

    prefix: TileConfig  # bf16/fp16 cache, values read from the key tile
    prefix_fp8: TileConfig  # fp8 cache: the widened tiles need more registers
    prefix_split_v: TileConfig  # values in a separate buffer: two tiles in shared memory
    tree: TileConfig
    # A merge program reads up to merge_block_d x merge_block_s partial values a step; the
    # launcher trades columns for parts to take every part in one step (launcher.merge_tile).
    merge_block_d: int = 64  # output columns a merge program owns (more programs: the merge is latency-bound)
    merge_block_s: int = 32  # parts a merge loop iteration reads
    merge_num_warps: int = 4
    max_splits: int = 512
    min_chunk: int = 128  # fewest prefix keys a split takes (short prefixes use fewer splits)
    # Key tiles fewer for each split whose programs start late, behind the tree kernel's
    # (VerifyPlan.split_reserve): the tree kernel holds its SMs ~8 µs, ~3 key tiles of the wide tile.
    late_split_tiles: int = 3
    # bf16/fp16 cache with V read from K: a taller tile reads each gathered key tile for more
    # rows. Used when a request has at least wide_min_rows rows (draft tokens x heads).
    prefix_wide: TileConfig | None = None
    # The same for an fp8 cache (either V layout): the widening of each 8-bit key tile is then
    # paid once for 64 rows (32 on sm_120) instead of once for every 16.
    prefix_wide_fp8: TileConfig | None = None
    # Where prefix_hopper's Gluon kernel runs (launcher.gluon_supports), an fp8 cache with V read from K
    # takes this wide tile instead: each 8-bit key tile widened once into a 16-bit one that both
    # wgmmas read. prefix_wide_fp8 stays the tile everywhere else (older or newer Triton, separate V).
    prefix_wide_fp8_gluon: TileConfig | None = None
    # Where prefix_hopper's Gluon kernel runs, requests of at most block_m rows (decode at 8 or 16 heads)
    # take its keys-major form (TileConfig.keys_major on a Gluon tile): no 64-row block, the rows are
    # wgmma's N, so a few rows do not pay for 64 on the tensor cores. One tile per cache dtype (V in K).
    prefix_narrow_gluon: TileConfig | None = None
    prefix_narrow_fp8_gluon: TileConfig | None = None
    wide_min_rows: int = 64
    # Where the wide tile is prefix_hopper's kernel, requests from this many rows take it, as one block
    # with the rows past the request masked: 17-63 rows then read the prefix once, not once a 16-row
    # block (HOPPER: 17, past its keys-major tile's 16 rows).
    gluon_wide_min_rows: int = 64
    # Rows past the last whole wide block (GLM-5: 72 = 64 + 8) run on the narrow tile (`prefix`,
    # or `prefix_fp8` for an fp8 cache: narrow_for) in a second launch when there are at most this
    # many, instead of in a mostly empty wide block.
    wide_tail_max_rows: int = 32
    # A wide tile run by the Gluon kernel (TileConfig.gluon) spreads the rows past its whole blocks over
    # them, up to this many a block (launcher.fused_tail_rows): their queries and P fit the shared
    # memory a block has left.
    gluon_tail_max_rows: int = 8
    # A bf16/fp16 cache's wide tile warp-specialized (prefix_hopper_ws.py): one warpgroup scores the
    # block, two accumulate its values, one takes those tail rows, instead of prefix_hopper.py's two
    # warpgroups doing all of it in one instruction stream.
    gluon_tail_partition: bool = False
    # Prefetch each split's slot indices into L2 before its loop (PTX prefetch): the gather of
    # every key tile waits on them, so each iteration would otherwise wait for a DRAM trip.
    prefetch_slots: bool = True
    # Launch every kernel after the tree kernel (the prefix launches, then the merge) as a
    # programmatic dependent of the one before it (sm_90+; the launcher ignores it elsewhere),
    # hiding each launch's latency in the grid before it.
    pdl: bool = True

    def prefix_for(self, rows_per_request: int, *, kv_fp8: bool = False, v_from_k: bool = True,
                   gluon: bool = False) -> TileConfig:
        """The prefix tile for requests of up to this many rows each, on this cache layout (`gluon`:
        where prefix_hopper's kernel runs, launcher.gluon_supports)."""
        if gluon and v_from_k:
            few = self.prefix_narrow_fp8_gluon if kv_fp8 else self.prefix_narrow_gluon
            if few is not None and rows_per_request <= few.block_m:
                return few
        wide = self.wide_for(kv_fp8=kv_fp8, v_from_k=v_from_k, gluon=gluon)
        min_rows = self.gluon_wide_min_rows if gluon and wide is not None and wide.gluon else self.wide_min_rows
        if wide is not None and rows_per_request >= min_rows:
            return wide
        if not kv_fp8 and not v_from_k:
            return self.prefix_split_v
        return self.narrow_for(kv_fp8=kv_fp8)

    def wide_for(self, *, kv_fp8: bool = False, v_from_k: bool = True, gluon: bool = False) -> TileConfig | None:
        """The wide tile of this cache layout, if it has one (bf16 only with V read from K; `gluon`:
        where prefix_hopper's kernel runs, which has its own fp8 tile)."""
        if kv_fp8:
            if gluon and v_from_k and self.prefix_wide_fp8_gluon is not None:
                return self.prefix_wide_fp8_gluon
            return self.prefix_wide_fp8
        return self.prefix_wide if v_from_k else None

    def narrow_for(self, *, kv_fp8: bool = False) -> TileConfig:
        """The tile that takes the row tail past a wide tile's whole blocks."""
        return self.prefix_fp8 if kv_fp8 else self.prefix

    def tail_rows(self, rows_per_request: int, *, kv_fp8: bool = False, v_from_k: bool = True,
                  gluon: bool = False) -> int:
        """Rows of each request that the narrow tile takes after the wide tile's whole blocks (0: none)."""
        tile = self.prefix_for(rows_per_request, kv_fp8=kv_fp8, v_from_k=v_from_k, gluon=gluon)
        if tile is not self.wide_for(kv_fp8=kv_fp8, v_from_k=v_from_k, gluon=gluon) or rows_per_request < tile.block_m:
            return 0  # no whole wide block: the wide tile (if it takes the request) masks the rows past it
        tail = rows_per_request % tile.block_m
        return tail if tail <= self.wide_tail_max_rows else 0


# sm_120 (and any GPU not listed): 99 KB of shared memory a block and about 100 KB an SM, so
# every prefix tile below is one program per SM there (the fit report says so); the 16-row
# tile double-buffers the gathered key tile (93 KB). fp8 tiles are widened in registers and
# need 8 warps to stay spill-free; they score keys-major with the values gathered apart (89 KB;
# on the H200 at one program an SM, as a stand-in: 185k n1 136.7 -> 125.2 µs, n9 619 -> 570,
# sweep log "session 5"). fp8 requests of 64+ rows take 32-row x 16-key tiles (73 KB) with the
# row tail on the 16-row one (same stand-in: 185k H8 n9 573.5 -> 455.3 µs, 64k H16 n9 371.6 ->
# 278.8; session 6). A separate V tile needs 16-key tiles to fit. A merge program reads up
# to 32 x 128 partial values a step (launcher.merge_tile).
SM120 = VerifyConfig(
    prefix=TileConfig(block_m=16, block_n=32, num_warps=4, num_stages=3, ctas_per_sm=1),
    prefix_fp8=TileConfig(block_m=16, block_n=32, num_warps=8, num_stages=3, ctas_per_sm=1, keys_major=True),
    prefix_split_v=TileConfig(block_m=32, block_n=16, num_warps=8, num_stages=2, ctas_per_sm=1),
    prefix_wide_fp8=TileConfig(block_m=32, block_n=16, num_warps=8, num_stages=3, ctas_per_sm=1, keys_major=True),
    tree=TileConfig(block_m=32, block_n=32, num_warps=8, num_stages=1),
    merge_block_d=32,
    merge_block_s=128,
)

# Hopper (sm_90, 227 KB of shared memory a block, 228 KB an SM). Measured on the H200 in CUDA
# graphs (kernels/results/sweep-h200.log, 2026-11-29 session 3): two 16-row programs an SM;
# 64-row x 64-key tiles (wgmma, one program an SM) once a request has 64+ rows, e.g. GLM-5's
# 72: 185k H8 n9 268 -> 237 µs, 185k H8 n33 839 -> 519 µs, 64k H64 n9 648 -> 364 µs; 3-7%
# slower at 8k-32k, faster from 64k. Decode (8 rows) stays on 16-row tiles (87 vs 140 µs).
# The fp8 tile with 4 warps: 122 vs 156 µs (n1), 451 vs 661 µs (n9). The wide tile and the
# 4-warp fp8 tile spill (560 and 176 bytes under Triton 3.9): measured faster anyway.
# Session 4: the row tail past the wide blocks (GLM-5: 8 of 72 rows) on the 16-row tile, in a
# launch beside the wide one, one wave of both: 185k H8 n9 226 -> 169 µs, 185k H16 n9 346 -> 283,
# 185k H8 n33 496 -> 447, bs4 64k H8 n9 322 -> 230 (sweep log, "session 4").
# Session 5: the fp8 tile scores keys-major with the values gathered apart, so both 8-bit gathers
# are asynchronous: 185k H8 n1 108.9 -> 101.7 µs, n9 442 -> 402, 64k H16 n9 288 -> 262 (sweep log).
# Session 6: fp8 requests of 64+ rows take a 64-row x 32-key keys-major tile (one an SM, spill-free),
# with the row tail on the 16-row fp8 tile, so each 8-bit key tile is widened once for 64 rows:
# 185k H8 n9 401 -> 265 µs, 64k H16 n9 260 -> 165 (64 x 64 keys-major: 452 / 277; sweep log).
# Session 7: the bf16 wide tile runs prefix_hopper.py's Gluon kernel (Triton 3.6-3.9; prefix.py's with the
# same tile elsewhere): 185k H64 n1 142.4 -> 97.3 µs, 185k H16 n33 914 -> 726; GLM-5's 8-row tail rides
# in the wide block (gluon_tail_max_rows) instead of a second launch: 185k H8 n9 171 -> 158 µs (sweep log).
# Session 8: the Gluon tile without spills, its scores split between the warpgroups, and the rows past
# the whole blocks spread over all of them: 185k H8 n9 153 -> 110 µs, 185k H16 n9 275 -> 186, H8 n33
# 467 -> 352. An fp8 cache with V in K takes the Gluon tile too (prefix_wide_fp8_gluon), each 8-bit
# tile widened once in shared memory: 185k H8 n9 fp8 267 -> 132 µs, 185k H16 n9 fp8 418 -> 232.
# Session 9: requests of at most 16 rows take the Gluon kernel's keys-major form on one warpgroup:
# 185k H8 n1 69.6 -> 61.7 µs, bs4 226.5 -> 212.7, fp8 98.3 -> 67.2 (8 warps: 65.1, 222.5, 76.3); 185k
# H16 n1 70.4 -> 64.3, fp8 96.7 -> 73.4 (N 32 would need 254 registers, and spills for fp8). Merge
# programs read up to 8,192 partial values a step (32 x 256; 4,096 before): 1-3% on every verify shape.
# Session 10: requests of 17-63 rows take the Gluon wide tile as one masked block (gluon_wide_min_rows 17):
# 185k H8 n3 112.1 -> 72.4 µs, n7 205.6 -> 83.6, fp8 171.2 -> 94.1 and 322.3 -> 104.3.
# Session 11: a 16-bit wide block's row tail on a warpgroup of its own (gluon_tail_partition,
# prefix_hopper_ws.py): 185k H8 n9 109.2 -> 98.5 µs, H16 n9 186.5 -> 165.6, H8 n33 351.8 -> 308.4.
# Session 13: that tile stages its part through shared memory, and GLM-5's last 3 splits are left to the
# tree kernel's programs (VerifyPlan.split_reserve): 185k H8 n9 99.0 -> 96.2 µs, 128k 75.3 -> 73.9,
# H16 n9 165.9 -> 162.4; 8k 27.7 -> 29.1 (sweep log, session 13).
# Session 14: the keys-major fp8 tile loads its wgmmas' left operands from the 8-bit stages into registers
# and widens them there (prefix_hopper._attend_rows_fp8): no 16-bit tile in shared memory, so two programs
# an SM with two stages each: 185k H8 n1 fp8 66.7 -> 51.8 µs, bs4 228 -> 162, 64k 34.3 -> 29.0; its key operand
# loaded as contiguous bytes (prefix_hopper._key_column): 51.0 -> 49.2 (sweep log, session 14 (4), (8)).
# Session 15: the warp-specialized tile scores its block on one warpgroup (all 64 keys: the queries are
# read from shared memory once a tile instead of once per warpgroup) and hands P to the second value
# warpgroup; `ready` completes on the copies landing: 185k H8 n9 96.0 -> 83.3 µs, 128k 73.9 -> 64.9,
# 64k 49.4 -> 44.4, H8 n33 302.6 -> 251.2 (sweep log, session 15 (1), (4)).
# Then the splits whose programs start behind the tree kernel's take late_split_tiles fewer key tiles
# instead of none, also with several blocks a split: 64k H16 n9 66.2 -> 62.9 µs, 185k H8 n33 251.7 -> 243.6,
# GLM-5 185k 83.5 -> 81.7 (session 15 (8)).
HOPPER = dataclasses.replace(
    SM120,
    prefix=dataclasses.replace(SM120.prefix, ctas_per_sm=2),
    prefix_fp8=TileConfig(block_m=16, block_n=32, num_warps=4, num_stages=3, ctas_per_sm=2, keys_major=True),
    prefix_wide=TileConfig(block_m=64, block_n=64, num_warps=8, num_stages=2, ctas_per_sm=1, gluon=True),
    prefix_wide_fp8=TileConfig(block_m=64, block_n=32, num_warps=8, num_stages=2, ctas_per_sm=1, keys_major=True),
    prefix_wide_fp8_gluon=TileConfig(block_m=64, block_n=64, num_warps=8, num_stages=2, ctas_per_sm=1, gluon=True),
    prefix_narrow_gluon=TileConfig(block_m=16, block_n=64, num_warps=4, num_stages=2, ctas_per_sm=1, keys_major=True,
                                   gluon=True),
    prefix_narrow_fp8_gluon=TileConfig(block_m=16, block_n=64, num_warps=4, num_stages=2, ctas_per_sm=2,
                                       keys_major=True, gluon=True),
    merge_block_s=256,
    gluon_wide_min_rows=17,
    gluon_tail_partition=True,
)

# Chosen by (major, minor) compute capability. Anything not listed, and the interpreter, gets
# FALLBACK: sm_120's tiles, plain Triton on mma.sync within 99 KB a block, which every GPU runs.
BY_CAPABILITY: dict[tuple[int, int], VerifyConfig] = {
    (12, 0): SM120,
    (9, 0): HOPPER,
}

FALLBACK = SM120
SHIPPED: dict[str, VerifyConfig] = {"sm120": SM120, "hopper": HOPPER}


def config_for(capability: tuple[int, int] | None) -> VerifyConfig:
    """The configuration the launcher uses on a device of this compute capability."""
    if capability is None:
        return FALLBACK
    return BY_CAPABILITY.get(tuple(capability), FALLBACK)


def capabilities_choosing(config: VerifyConfig) -> list[tuple[int, int]]:
    """Capabilities that select `config`; FALLBACK (sm_120's) is also the choice for unknown ones."""
    chosen = [cap for cap, conf in BY_CAPABILITY.items() if conf == config]
    if config == FALLBACK:
        chosen.append((12, 0))
    return sorted(set(chosen))


def config_name(config: VerifyConfig) -> str:
    """The name a shipped config goes by ("sm120", "hopper"), or "custom"."""
    return next((name for name, shipped in SHIPPED.items() if shipped == config), "custom")
