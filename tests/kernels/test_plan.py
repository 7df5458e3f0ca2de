"""The split count: whole waves of resident programs, never a lone program in a tail wave."""

from __future__ import annotations

import math

import pytest

from ddtree_kernels.launcher import split_count


@pytest.mark.parametrize("per_split,slots", [(5, 264), (1, 264), (3, 132), (9, 264), (20, 264), (40, 264),
                                             (7, 132), (300, 264), (1, 84), (13, 188)])
def test_split_count_fills_whole_waves(per_split, slots):
    splits = split_count(per_split, slots, max_splits=512)
    programs = per_split * splits
    waves = math.ceil(programs / slots)
    assert 1 <= splits <= 512
    # the last wave is at least 97% full, unless one split already overfills the GPU
    assert programs >= 0.97 * waves * slots or splits == 1, (splits, programs, waves)


def test_split_count_avoids_the_tail_wave_of_rounding_up():
    # GLM-5 at bs 1: 5 row blocks of 16 on 132 SMs x 2 programs; ceil(264 / 5) = 53 splits would
    # launch 265 programs, one of them alone in a second wave.
    assert split_count(5, 264, 512) == 52


def test_split_count_respects_the_cap():
    assert 62 <= split_count(1, 10_000, 64) <= 64  # within 3% of the capped best
    # a batch that fills the GPU many times over is split only to even out its last wave
    assert split_count(1000, 264, 512) <= 8


@pytest.mark.parametrize("kv_fp8,v_from_k", [(False, True), (True, True), (False, False)])
def test_plan_sizes_its_grid_by_the_tile_that_runs(kv_fp8, v_from_k):
    """GLM-5's 72 rows a request take Hopper's 64-row tile in bf16 but the 16-row fp8 tile: the
    split count must come from the tile launched, or an fp8 call leaves a tail wave."""
    from ddtree_kernels.configs import HOPPER
    from ddtree_kernels.launcher import plan_verify

    plan = plan_verify(1, 8, 9, 9, "cpu", config=HOPPER, kv_fp8=kv_fp8, v_from_k=v_from_k)
    tile = plan.prefix_tile
    expected = HOPPER.prefix_fp8 if kv_fp8 else HOPPER.prefix_wide if v_from_k else HOPPER.prefix_split_v
    assert tile is expected
    sm_count = 4  # what the planner assumes off a GPU
    assert plan.num_splits == split_count(math.ceil(72 / tile.block_m), tile.ctas_per_sm * sm_count, HOPPER.max_splits)
