"""Launch configurations, per GPU architecture, and the rule that admits them.

There is no run-time autotuning: a verify call is captured into a CUDA graph, so
the configuration must be a pure function of static facts (architecture, shapes).
Every configuration here is compiled offline for sm_120 and sm_90 by the fit test
(`python -m ddtree_tools.fit`), which fails on one that does not fit.
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
    # it against the compiled kernel (`python -m ddtree_tools.fit`).
    ctas_per_sm: int = 2
    # Prefix tiles: score keys x rows (the key tile as the left operand, untransposed) and gather
    # the values apart from the keys. For fp8 this keeps both gathers asynchronous (one 8-bit tile
    # feeding two differently laid out operands is loaded synchronously by Triton's pipeliner).
    keys_major: bool = False
    # The wide Hopper tile written in Gluon (hopper/prefix.py) instead of prefix.py's: taken on sm_90
    # where the installed Triton runs it (gluon_shared.TESTED_TRITON) and V is read from K, D_V 512,
    # D_R 64; prefix.py's kernel runs the same bf16 tile everywhere else (for fp8:
    # VerifyConfig.prefix_wide_fp8_gluon, with prefix_wide_fp8 everywhere else).
    gluon: bool = False
    # Prefix tiles with values read from the key rows: prefix_chunked.py's kernel, the scores as four
    # independent MMA chains instead of one down the whole latent (for GPUs without wgmma).
    chunked: bool = False
    # Prefix tiles for a cache (16-bit or fp8) with values read from the key rows: prefix_mma_v2.py's Gluon kernel
    # (mma.sync, the latent split across the warps), where it runs (prefix_mma_v2.supports). Elsewhere
    # (the interpreter, an untested Triton, another cache) `fallback` takes its launches: same rows a
    # program and programs an SM, so the plan's splits and row blocks hold for both.
    mma_v2: bool = False
    fallback: TileConfig | None = None


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
    # (VerifyPlan.split_reserve): the tree kernel holds its SMs about 3 key tiles' time of the wide tile.
    late_split_tiles: int = 3
    # bf16/fp16 cache with V read from K: a taller tile reads each gathered key tile for more
    # rows. Used when a request has at least wide_min_rows rows (draft tokens x heads).
    prefix_wide: TileConfig | None = None
    # The same for an fp8 cache (either V layout): the widening of each 8-bit key tile is then
    # paid once for 64 rows (32 on sm_120) instead of once for every 16.
    prefix_wide_fp8: TileConfig | None = None
    # Where hopper/prefix.py's Gluon kernel runs (hopper.plan.gluon_supports), an fp8 cache with V read from K
    # takes this wide tile instead: each 8-bit key tile widened once into a 16-bit one that both
    # wgmmas read. prefix_wide_fp8 stays the tile everywhere else (older or newer Triton, separate V).
    prefix_wide_fp8_gluon: TileConfig | None = None
    # Where hopper/prefix.py's Gluon kernel runs, requests of at most block_m rows (decode at 8 or 16 heads)
    # take its keys-major form (TileConfig.keys_major on a Gluon tile): no 64-row block, the rows are
    # wgmma's N, so a few rows do not pay for 64 on the tensor cores. One tile per cache dtype (V in K).
    prefix_narrow_gluon: TileConfig | None = None
    prefix_narrow_fp8_gluon: TileConfig | None = None
    # Where those do not apply, requests of at most block_m rows (decode at 8 or 16 heads), V read from K,
    # take this tile: few enough keys a step that two programs share an SM, one's latency hidden behind the
    # other's. One per cache dtype; None: such requests take `prefix` (or `prefix_fp8`).
    prefix_small: TileConfig | None = None
    prefix_small_fp8: TileConfig | None = None
    # Values in a separate buffer and keys at most 128 wide (a GQA draft model's heads, e.g. the DFlash
    # drafter DDTree runs beside the target: 6 heads x 16 block tokens at TP 8): a request's rows in one
    # block and 64-key tiles, where `prefix_split_v` is sized for 576-wide MLA rows. None: `prefix_split_v`.
    prefix_split_v_narrow_head: TileConfig | None = None
    wide_min_rows: int = 64
    # Where the wide tile is hopper/prefix.py's kernel, requests from this many rows take it, as one block
    # with the rows past the request masked: 17-63 rows then read the prefix once, not once a 16-row
    # block (HOPPER: 17, past its keys-major tile's 16 rows).
    gluon_wide_min_rows: int = 64
    # Rows past the last whole wide block (GLM-5: 72 = 64 + 8) run on the narrow tile (`prefix`,
    # or `prefix_fp8` for an fp8 cache: narrow_for) in a second launch when there are at most this
    # many, instead of in a mostly empty wide block.
    wide_tail_max_rows: int = 32
    # A wide tile run by the Gluon kernel (TileConfig.gluon) spreads the rows past its whole blocks over
    # them, up to this many a block (hopper.plan.fused_tail_rows): their queries and P fit the shared
    # memory a block has left.
    gluon_tail_max_rows: int = 8
    # A bf16/fp16 cache's wide tile warp-specialized (hopper/prefix_ws.py): one warpgroup scores the
    # block, two accumulate its values, one takes those tail rows, instead of hopper/prefix.py's two
    # warpgroups doing all of it in one instruction stream.
    gluon_tail_partition: bool = False
    # Prefetch each split's slot indices into L2 before its loop (PTX prefetch): the gather of
    # every key tile waits on them, so each iteration would otherwise wait for a DRAM trip.
    prefetch_slots: bool = True
    # Launch every kernel after the tree kernel (the prefix launches, then the merge) as a
    # programmatic dependent of the one before it (sm_90+; the launcher ignores it elsewhere),
    # hiding each launch's latency in the grid before it.
    pdl: bool = True

    def with_fallbacks(self) -> VerifyConfig:
        """This configuration with every tile that has a fallback replaced by it: what runs where the
        Gluon tiles do not (the interpreter, a Triton outside gluon_shared.TESTED_TRITON)."""
        tiles = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return dataclasses.replace(self, **{name: tile.fallback for name, tile in tiles.items()
                                            if isinstance(tile, TileConfig) and tile.fallback is not None})

    def prefix_for(self, rows_per_request: int, *, kv_fp8: bool = False, v_from_k: bool = True,
                   gluon: bool = False, key_width: int = 576) -> TileConfig:
        """The prefix tile for requests of up to this many rows each, on this cache layout (`gluon`:
        where hopper/prefix.py's kernel runs, hopper.plan.gluon_supports; `key_width`: D_V + D_R)."""
        if v_from_k:
            narrow_gluon = self.prefix_narrow_fp8_gluon if kv_fp8 else self.prefix_narrow_gluon
            few = narrow_gluon if gluon and narrow_gluon is not None else (
                self.prefix_small_fp8 if kv_fp8 else self.prefix_small)
            if few is not None and rows_per_request <= few.block_m:
                return few
        wide = self.wide_for(kv_fp8=kv_fp8, v_from_k=v_from_k, gluon=gluon)
        min_rows = self.gluon_wide_min_rows if gluon and wide is not None and wide.gluon else self.wide_min_rows
        if wide is not None and rows_per_request >= min_rows:
            return wide
        if not kv_fp8 and not v_from_k:
            narrow_head = self.prefix_split_v_narrow_head
            return narrow_head if narrow_head is not None and key_width <= 128 else self.prefix_split_v
        return self.narrow_for(kv_fp8=kv_fp8)

    def wide_for(self, *, kv_fp8: bool = False, v_from_k: bool = True, gluon: bool = False) -> TileConfig | None:
        """The wide tile of this cache layout, if it has one (bf16 only with V read from K; `gluon`:
        where hopper/prefix.py's kernel runs, which has its own fp8 tile)."""
        if kv_fp8:
            if gluon and v_from_k and self.prefix_wide_fp8_gluon is not None:
                return self.prefix_wide_fp8_gluon
            return self.prefix_wide_fp8
        return self.prefix_wide if v_from_k else None

    def narrow_for(self, *, kv_fp8: bool = False) -> TileConfig:
        """The tile that takes the row tail past a wide tile's whole blocks."""
        return self.prefix_fp8 if kv_fp8 else self.prefix

    def tail_rows(self, rows_per_request: int, *, kv_fp8: bool = False, v_from_k: bool = True,
                  gluon: bool = False, key_width: int = 576) -> int:
        """Rows of each request that the narrow tile takes after the wide tile's whole blocks (0: none)."""
        tile = self.prefix_for(rows_per_request, kv_fp8=kv_fp8, v_from_k=v_from_k, gluon=gluon, key_width=key_width)
        if tile is not self.wide_for(kv_fp8=kv_fp8, v_from_k=v_from_k, gluon=gluon) or rows_per_request < tile.block_m:
            return 0  # no whole wide block: the wide tile (if it takes the request) masks the rows past it
        tail = rows_per_request % tile.block_m
        return tail if tail <= self.wide_tail_max_rows else 0


# sm_120: 99 KB of shared memory a block and ~100 KB an SM (fit report). A cache with V in K takes
# prefix_mma_v2.py's Gluon tiles (mma.sync, 8 warps splitting the latent, two stages), one program an
# SM: 16 rows x 32 keys (83 KB), and for requests of 64+ rows 32 rows (92 KB; GLM-5's 72 rows: two
# 32-row blocks and an 8-row tail on the 16-row tile, three reads of each key tile instead of five).
# fp8 runs the same tiles, loading 8-bit keys and widening them to fp16 in shared memory; its decode
# (up to 16 rows) takes a 16-key form (42 KB, 128 registers), two programs an SM, one's widening
# hidden behind the other's (a 16-bit cache's cp.async gathers measured no faster so). Without Gluon
# the 16-bit tiles fall back to prefix_chunked.py's (four short score chains) and the fp8 ones to
# prefix.py's keys-major tiles, widened in registers (8 warps to stay spill-free).
SM120 = VerifyConfig(
    prefix=TileConfig(block_m=16, block_n=32, num_warps=8, num_stages=2, ctas_per_sm=1, mma_v2=True,
                      fallback=TileConfig(block_m=16, block_n=64, num_warps=4, num_stages=2, ctas_per_sm=1,
                                          chunked=True)),
    prefix_fp8=TileConfig(block_m=16, block_n=32, num_warps=8, num_stages=2, ctas_per_sm=1, mma_v2=True,
                          fallback=TileConfig(block_m=16, block_n=32, num_warps=8, num_stages=3, ctas_per_sm=1,
                                              keys_major=True)),
    prefix_split_v=TileConfig(block_m=32, block_n=16, num_warps=8, num_stages=2, ctas_per_sm=1),
    # The DFlash drafter's attention (6 heads x 16 tokens, head 128) at 185k: 74 us a layer against 476 for
    # prefix_split_v's tile in sm_120 emulation (61 against 475 natively on the H200); BENCHMARKS.md.
    prefix_split_v_narrow_head=TileConfig(block_m=128, block_n=64, num_warps=8, num_stages=2, ctas_per_sm=1),
    prefix_wide=TileConfig(block_m=32, block_n=32, num_warps=8, num_stages=2, ctas_per_sm=1, mma_v2=True,
                           fallback=TileConfig(block_m=32, block_n=32, num_warps=8, num_stages=2, ctas_per_sm=1,
                                               chunked=True)),
    prefix_wide_fp8=TileConfig(block_m=32, block_n=32, num_warps=8, num_stages=2, ctas_per_sm=1, mma_v2=True,
                               fallback=TileConfig(block_m=32, block_n=16, num_warps=8, num_stages=3, ctas_per_sm=1,
                                                   keys_major=True)),
    prefix_small_fp8=TileConfig(block_m=16, block_n=16, num_warps=8, num_stages=2, ctas_per_sm=2, mma_v2=True,
                                fallback=TileConfig(block_m=16, block_n=16, num_warps=4, num_stages=2, ctas_per_sm=2,
                                                    keys_major=True)),
    tree=TileConfig(block_m=32, block_n=32, num_warps=8, num_stages=1),
    merge_block_d=32,
    merge_block_s=128,
)

# Hopper (sm_90, 227 KB a block): two 16-row programs an SM; requests of 17+ rows take the Gluon
# wide tile of hopper/prefix.py (wgmma, 64 x 64, one an SM; warp-specialized with a row tail), up
# to 16 rows its keys-major form.
HOPPER = dataclasses.replace(
    SM120,
    prefix=TileConfig(block_m=16, block_n=32, num_warps=4, num_stages=3, ctas_per_sm=2),
    prefix_fp8=TileConfig(block_m=16, block_n=32, num_warps=4, num_stages=3, ctas_per_sm=2, keys_major=True),
    prefix_wide=TileConfig(block_m=64, block_n=64, num_warps=8, num_stages=2, ctas_per_sm=1, gluon=True),
    prefix_wide_fp8=TileConfig(block_m=64, block_n=32, num_warps=8, num_stages=2, ctas_per_sm=1, keys_major=True),
    prefix_wide_fp8_gluon=TileConfig(block_m=64, block_n=64, num_warps=8, num_stages=2, ctas_per_sm=1, gluon=True),
    prefix_small=None,
    prefix_small_fp8=None,
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
