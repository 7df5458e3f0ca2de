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


@dataclass(frozen=True)
class TileConfig:
    """One kernel's tile shape and launch parameters."""

    block_m: int  # rows (draft token x head) a program owns
    block_n: int  # keys a loop iteration loads
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class VerifyConfig:
    """Everything the launcher needs to pick for one architecture."""

    prefix: TileConfig  # bf16/fp16 cache, values read from the key tile
    prefix_fp8: TileConfig  # fp8 cache: the widened tiles need more registers
    prefix_split_v: TileConfig  # values in a separate buffer: two tiles in shared memory
    tree: TileConfig
    merge_block_d: int = 64  # output columns a merge program owns (more programs: the merge is latency-bound)
    merge_block_s: int = 32  # parts a merge loop iteration reads
    merge_num_warps: int = 4
    ctas_per_sm: int = 2  # prefix programs to aim for, per SM, when choosing the split count
    max_splits: int = 512
    min_chunk: int = 128  # fewest prefix keys a split takes (short prefixes use fewer splits)
    # bf16/fp16 cache with V read from K: a taller tile reads each gathered key tile for more
    # rows. Used when a request has at least wide_min_rows rows (draft tokens x heads) and the
    # batch at least wide_min_batch_rows, so short single requests keep enough programs.
    prefix_wide: TileConfig | None = None
    wide_min_rows: int = 64
    wide_min_batch_rows: int = 128

    def prefix_for(self, rows_per_request: int, batch_size: int = 1) -> TileConfig:
        """The bf16 prefix tile for a batch of requests of up to this many rows each."""
        if (self.prefix_wide is not None and rows_per_request >= self.wide_min_rows
                and rows_per_request * batch_size >= self.wide_min_batch_rows):
            return self.prefix_wide
        return self.prefix


# Measured on an H200 with CUDA-graph timing (BENCHMARKS.md, scratch sweeps summarised in
# kernels/README.md): 16-row x 32-key tiles with 4 warps and 3 stages beat 32-row tiles at
# every verify shape tried (32-row tiles either spill at 4 warps or re-read operands from
# shared memory at 8), and fit sm_120 (56,832 bytes, no spills). fp8 tiles are widened in
# registers and need 8 warps to stay spill-free; a separate V tile needs 16-key tiles to fit.
PORTABLE = VerifyConfig(
    prefix=TileConfig(block_m=16, block_n=32, num_warps=4, num_stages=3),
    prefix_fp8=TileConfig(block_m=16, block_n=32, num_warps=8, num_stages=3),
    prefix_split_v=TileConfig(block_m=32, block_n=16, num_warps=8, num_stages=2),
    tree=TileConfig(block_m=32, block_n=32, num_warps=8, num_stages=1),
)

# Hopper (sm_90, 227 KB of shared memory a block): 64-row tiles for batches of 128+ rows.
# Measured on the H200 in CUDA graphs (kernels/results/sweep-h200.log): 185k H8 n33
# 1723 -> 819 µs, 185k H16 n9 920 -> 478 µs, 64k H16 n9 297 -> 204 µs, bs4 x 64k H8 n9
# 695 -> 463 µs; a single H8 n9 request (72 rows) is faster on 16-row tiles up to 131k
# (135 vs 151 µs at 64k), and decode (8 rows) much faster (104 vs 194 µs). The wide tile
# takes 148 KB of shared memory (cannot load on sm_120) and spills 248 B on sm_90.
HOPPER = dataclasses.replace(PORTABLE, prefix_wide=TileConfig(block_m=64, block_n=32, num_warps=8, num_stages=3))

# Chosen by (major, minor) compute capability; anything not listed gets PORTABLE.
BY_CAPABILITY: dict[tuple[int, int], VerifyConfig] = {
    (12, 0): PORTABLE,
    (9, 0): HOPPER,
}

SHIPPED: dict[str, VerifyConfig] = {"portable": PORTABLE, "hopper": HOPPER}


def config_for(capability: tuple[int, int] | None) -> VerifyConfig:
    """The configuration the launcher uses on a device of this compute capability."""
    if capability is None:
        return PORTABLE
    return BY_CAPABILITY.get(tuple(capability), PORTABLE)


def capabilities_choosing(config: VerifyConfig) -> list[tuple[int, int]]:
    """Capabilities that select `config`; PORTABLE is also the fallback for unknown ones."""
    chosen = [cap for cap, conf in BY_CAPABILITY.items() if conf == config]
    if config == PORTABLE:
        chosen.append((12, 0))
    return sorted(set(chosen))
