"""The split count: whole waves of resident programs, never a lone program in a tail wave."""

from __future__ import annotations

import math

import pytest

from ddtree_kernels import gluon_shared
from ddtree_kernels.configs import HOPPER, SM120
from ddtree_kernels.launcher import plan_verify, split_count


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


def test_split_count_fills_the_wave_to_the_last_slot():
    # decode (one program a split, 132 SMs x 2) and GLM-5 on Hopper (a wide program and two
    # half-SM tail programs a split): among near-equal costs in one wave, the fullest wave wins
    assert split_count(1, 264, 512) == 264
    assert split_count(3, 264, 512) == 88
    assert split_count(4, 264, 512) == 66


def test_split_count_respects_the_cap():
    assert split_count(1, 10_000, 64) == 64  # the cap, and one wave filled as far as it allows
    # a batch that fills the GPU many times over is split only to even out its last wave
    assert split_count(1000, 264, 512) <= 8


@pytest.mark.parametrize("kv_fp8,v_from_k", [(False, True), (True, True), (False, False)])
def test_plan_sizes_its_grid_by_the_tile_that_runs(kv_fp8, v_from_k):
    """GLM-5's 72 rows a request take Hopper's 64-row tiles (bf16 or fp8) with an 8-row tail, but
    the 16-row tile where V is apart from K in bf16: the split count must come from the tiles
    launched, or a call leaves a tail wave."""
    from ddtree_kernels.configs import HOPPER
    from ddtree_kernels.launcher import plan_verify

    plan = plan_verify(1, 8, 9, 9, "cpu", config=HOPPER, kv_fp8=kv_fp8, v_from_k=v_from_k)
    tile = plan.prefix_tile
    expected = HOPPER.prefix_wide_fp8 if kv_fp8 else HOPPER.prefix_wide if v_from_k else HOPPER.prefix_split_v
    assert tile is expected
    # Off a GPU the planner assumes 4 SMs.
    if tile is HOPPER.prefix_wide or tile is HOPPER.prefix_wide_fp8:
        # 64 rows on the wide tile (one an SM, 2 half-SM shares) beside an 8-row tail on the 16-row tile
        # (two an SM, 1 share): 3 shares a split on 8 half-SM slots, so 8 splits fill exactly 3 waves.
        assert plan.tail_rows == 8
        assert plan.num_splits == 8
    else:
        # 72 rows as three 32-row programs a split, one an SM: 4 splits fill exactly 3 waves of 4.
        assert plan.tail_rows == 0 and tile.block_m == 32 and tile.ctas_per_sm == 1
        assert plan.num_splits == 4


@pytest.mark.parametrize("heads,tokens,launches", [
    (8, 9, [("wide", 0, 1), ("prefix", 64, 1)]),     # GLM-5: 72 = 64 + an 8-row tail
    (16, 9, [("wide", 0, 2), ("prefix", 128, 1)]),   # 144 = 128 + 16
    (8, 33, [("wide", 0, 4), ("prefix", 256, 1)]),   # 264 = 256 + 8
    (8, 12, [("wide", 0, 1), ("prefix", 64, 2)]),    # 96 = 64 + 32: still a tail
    (4, 25, [("wide", 0, 2)]),                       # 100 = 64 + 36: too many, one more wide block
    (64, 9, [("wide", 0, 9)]),                       # 576: whole wide blocks
    (8, 1, [("prefix", 0, 1)]),                      # decode: the 16-row tile alone
])
@pytest.mark.parametrize("kv_fp8", [False, True])
def test_row_tail_goes_to_the_narrow_tile(heads, tokens, launches, kv_fp8):
    """A few rows past the last whole 64-row block would waste most of a wide block (and its
    key gather): up to wide_tail_max_rows of them run on the 16-row tile in a second launch,
    the fp8 one for an fp8 cache."""
    from ddtree_kernels.configs import HOPPER
    from ddtree_kernels.launcher import plan_verify

    plan = plan_verify(1, heads, tokens, tokens, "cpu", config=HOPPER, kv_fp8=kv_fp8)
    names = ({id(HOPPER.prefix_wide_fp8): "wide", id(HOPPER.prefix_fp8): "prefix"} if kv_fp8 else
             {id(HOPPER.prefix_wide): "wide", id(HOPPER.prefix): "prefix"})
    got = [(names[id(tile)], row_base, blocks) for tile, row_base, blocks in plan.prefix_launches()]
    assert got == launches
    covered = sum(blocks * tile.block_m for tile, _, blocks in plan.prefix_launches())
    assert covered >= heads * tokens  # every row is owned by some program


@pytest.mark.parametrize("heads,tokens,kv_fp8,fused", [
    (8, 9, False, 8),    # GLM-5: one wide block of 64 + 8 rows
    (16, 9, False, 8),   # 144 rows: two blocks of 72
    (8, 17, False, 4),   # 136 rows: two blocks of 68
    (8, 33, False, 2),   # 264 rows: four blocks of 66
    (16, 33, False, 2),  # 528 rows: eight blocks of 66
    (8, 8, False, 0),    # 64 rows: no tail
    (64, 9, False, 0),   # 576 rows: nine whole blocks
    (8, 11, False, 0),   # 88 rows: 24 past one block, more than a block's tail takes: a second launch
    (8, 1, False, 0),    # decode: no wide tile (the keys-major tile: test_gluon_keys_major_tile_...)
    (8, 9, True, 8),     # fp8: the Gluon fp8 tile (widened in shared memory) spreads it the same way
    (16, 33, True, 2),
])
def test_gluon_wide_tile_spreads_a_short_tail_over_its_blocks(heads, tokens, kv_fp8, fused):
    """Where prefix_hopper's kernel runs (plan.gluon), the rows past the whole wide blocks ride in
    those blocks, on the key tiles they gather anyway, instead of a second launch that reads the
    prefix again; each block then owns BLOCK_M + fused rows, and together they own every row."""
    from ddtree_kernels.configs import HOPPER
    from ddtree_kernels.hopper.plan import fused_tail_rows
    from ddtree_kernels.launcher import prefix_launches

    rows = heads * tokens
    assert fused_tail_rows(HOPPER, rows, kv_fp8=kv_fp8, v_from_k=True, gluon=True) == fused
    assert fused_tail_rows(HOPPER, rows, kv_fp8=kv_fp8, v_from_k=True, gluon=False) == 0
    # An fp8 cache with separate V has no Gluon tile: prefix.py's wide fp8 tile and a tail launch.
    assert fused_tail_rows(HOPPER, rows, kv_fp8=True, v_from_k=False, gluon=True) == 0
    launches = prefix_launches(HOPPER, rows, kv_fp8=kv_fp8, v_from_k=True, gluon=True)
    if fused:
        wide = HOPPER.prefix_wide_fp8_gluon if kv_fp8 else HOPPER.prefix_wide
        blocks = rows // wide.block_m
        assert launches == ((wide, 0, blocks),)
        assert (blocks - 1) * (64 + fused) < rows <= blocks * (64 + fused)  # every row, no empty block
        assert fused <= HOPPER.gluon_tail_max_rows
    elif rows > HOPPER.prefix_narrow_gluon.block_m:
        assert launches == prefix_launches(HOPPER, rows, kv_fp8=kv_fp8, v_from_k=True, gluon=False)


@pytest.mark.parametrize("heads,tokens,kv_fp8,tail_n", [(8, 1, False, 8), (8, 1, True, 8), (4, 2, False, 8),
                                                        (2, 3, True, 8), (1, 1, False, 8), (16, 1, False, 16),
                                                        (8, 2, True, 16), (3, 3, False, 16)])
def test_gluon_keys_major_tile_takes_requests_of_a_few_rows(heads, tokens, kv_fp8, tail_n):
    """Where prefix_hopper's kernel runs, a request of at most 16 rows (decode at 8 or 16 heads) takes its
    keys-major tile: one launch, one block a request, no 64-row block (BLOCK_M 0) and its rows as wgmma's
    N (TAIL_N: 8, or 16 past 8 rows)."""
    from ddtree_kernels.configs import HOPPER
    from ddtree_kernels.hopper.plan import fused_tail_rows
    from ddtree_kernels.launcher import VerifyPlan, prefix_launches

    rows = heads * tokens
    narrow = HOPPER.prefix_narrow_fp8_gluon if kv_fp8 else HOPPER.prefix_narrow_gluon
    assert narrow.gluon and narrow.keys_major and rows <= narrow.block_m
    assert HOPPER.prefix_for(rows, kv_fp8=kv_fp8, gluon=True) is narrow
    assert prefix_launches(HOPPER, rows, kv_fp8=kv_fp8, v_from_k=True, gluon=True) == ((narrow, 0, 1),)
    assert fused_tail_rows(HOPPER, rows, kv_fp8=kv_fp8, v_from_k=True, gluon=True) == 0
    plan = VerifyPlan(1, heads, tokens, tokens, 512, 64, 132, HOPPER, kv_fp8=kv_fp8, pdl=True, gluon=True)
    assert plan.gluon_rows == (0, tail_n, rows)
    # Without the Gluon kernel, or with V apart: prefix.py's tiles, as before.
    assert not HOPPER.prefix_for(rows, kv_fp8=kv_fp8, gluon=False).gluon
    assert not HOPPER.prefix_for(rows, kv_fp8=kv_fp8, v_from_k=False, gluon=True).gluon
    # The wide tile's rows, for comparison: GLM-5's 72 are one block of 64 + an 8-row tail.
    glm5 = VerifyPlan(1, 8, 9, 9, 512, 64, 132, HOPPER, kv_fp8=kv_fp8, pdl=True, gluon=True)
    assert glm5.gluon_rows == (64, 8, 72)


@pytest.mark.parametrize("heads,tokens,kv_fp8", [(8, 3, False), (17, 1, True), (8, 4, False), (8, 7, True),
                                                 (9, 7, False)])
def test_gluon_wide_tile_takes_17_to_63_rows_as_one_masked_block(heads, tokens, kv_fp8):
    """A request past the keys-major tile's 16 rows and short of a whole 64-row block takes the Gluon wide
    tile as one block with its missing rows masked (reading the prefix once), not prefix.py's 16-row tile
    once every 16 rows (HOPPER.gluon_wide_min_rows 17); without the Gluon kernel nothing changes."""
    from ddtree_kernels.configs import HOPPER
    from ddtree_kernels.hopper.plan import fused_tail_rows
    from ddtree_kernels.launcher import VerifyPlan, prefix_launches

    rows = heads * tokens
    assert HOPPER.gluon_wide_min_rows <= rows < 64
    wide = HOPPER.wide_for(kv_fp8=kv_fp8, gluon=True)
    assert wide.gluon and HOPPER.prefix_for(rows, kv_fp8=kv_fp8, gluon=True) is wide
    assert HOPPER.tail_rows(rows, kv_fp8=kv_fp8, gluon=True) == 0
    assert fused_tail_rows(HOPPER, rows, kv_fp8=kv_fp8, v_from_k=True, gluon=True) == 0
    assert prefix_launches(HOPPER, rows, kv_fp8=kv_fp8, v_from_k=True, gluon=True) == ((wide, 0, 1),)
    plan = VerifyPlan(1, heads, tokens, tokens, 512, 64, 132, HOPPER, kv_fp8=kv_fp8, pdl=True, gluon=True)
    assert plan.gluon_rows == (64, 0, 64)
    assert HOPPER.prefix_for(rows, kv_fp8=kv_fp8, gluon=False) is HOPPER.narrow_for(kv_fp8=kv_fp8)
    # one row fewer than the wide tile takes: the keys-major tile
    few = HOPPER.prefix_for(HOPPER.gluon_wide_min_rows - 1, kv_fp8=kv_fp8, gluon=True)
    assert few.gluon and few.keys_major


@pytest.mark.parametrize("version,runs", [("3.5.1", False), ("3.6.0", True), ("3.9.0", True),
                                          ("3.10.0", False), ("4.0.0", False)])
def test_gluon_kernel_only_on_the_triton_releases_it_is_checked_on(version, runs):
    """Gluon renames things between releases: outside the checked range the launcher keeps prefix.py's tile
    and the reason names the range (and where to widen it)."""

    reason = gluon_shared.unavailable_reason(version)
    assert (reason == "") == runs
    if not runs:
        assert version in reason and "TESTED_TRITON" in reason


def test_gluon_kernel_only_for_hopper_and_its_cache_layout():
    from ddtree_kernels.hopper.plan import gluon_supports
    from ddtree_kernels.interpreter import interpreting

    glm5 = dict(v_from_k=True, d_v=512, d_rope=64)
    assert not gluon_supports(None, **glm5)  # no GPU
    assert not gluon_supports((12, 0), **glm5)  # sm_120: no wgmma
    assert not gluon_supports((9, 0), **(glm5 | {"v_from_k": False}))
    assert not gluon_supports((9, 0), **(glm5 | {"d_rope": 32}))
    # under TRITON_INTERPRET (the CPU suite) nothing compiles, so it is never chosen there either
    runs = not interpreting() and not gluon_shared.unavailable_reason()
    assert gluon_supports((9, 0), **glm5) == runs  # either cache dtype: fp8 is widened in shared memory


@pytest.mark.parametrize("parts", [2, 17, 65, 129, 258, 513, 2000])
def test_merge_tile_covers_the_parts_within_its_register_budget(parts):
    """One step over every part where the budget allows; never more values than the budget."""
    from ddtree_kernels.configs import HOPPER
    from ddtree_kernels.launcher import merge_tile

    block_d, block_s = merge_tile(HOPPER, parts)
    budget = HOPPER.merge_block_d * HOPPER.merge_block_s
    assert block_d * block_s <= budget
    assert block_d >= 8 and block_d & (block_d - 1) == 0 and block_s & (block_s - 1) == 0
    if parts <= budget // 8:
        assert block_s >= parts


def test_programmatic_dependent_launch_only_where_it_exists():
    """PDL needs sm_90+ and real PTX: never under the interpreter or on a CPU device."""
    from ddtree_kernels.configs import HOPPER
    from ddtree_kernels.launcher import plan_verify, uses_pdl

    assert not uses_pdl(HOPPER, None)  # a CPU device has no compute capability
    assert not plan_verify(1, 8, 9, 9, "cpu", config=HOPPER).pdl  # the plan carries the decision


@pytest.mark.parametrize("heads,tokens,kv_fp8,gluon,partition", [
    (8, 9, False, True, True),     # GLM-5: 64 rows + an 8-row tail, bf16
    (16, 9, False, True, True),    # two blocks of 72
    (8, 33, False, True, True),    # four blocks of 66
    (8, 9, True, True, False),     # fp8: prefix_hopper's kernel widens each tile in the block's stream
    (8, 8, False, True, False),    # 64 rows: no tail
    (8, 3, False, True, False),    # 24 rows: one masked block, no tail
    (8, 1, False, True, False),    # decode: the keys-major tile
    (8, 9, False, False, False),   # no Gluon kernel here (sm_120, or a Triton outside TESTED_TRITON)
])
def test_row_tail_takes_a_warpgroup_of_its_own_where_it_has_rows(heads, tokens, kv_fp8, gluon, partition):
    """HOPPER runs a Gluon wide block's row tail on a partition of its own (prefix_hopper_ws) for a 16-bit
    cache; every other plan keeps its kernel, and a config without the option never takes it."""
    import dataclasses

    from ddtree_kernels.configs import HOPPER
    from ddtree_kernels.launcher import VerifyPlan

    plan = VerifyPlan(1, heads, tokens, tokens, 512, 64, 132, HOPPER, kv_fp8=kv_fp8, pdl=True, gluon=gluon)
    assert plan.tail_partition is partition
    off = dataclasses.replace(HOPPER, gluon_tail_partition=False)
    plan_off = VerifyPlan(1, heads, tokens, tokens, 512, 64, 132, off, kv_fp8=kv_fp8, pdl=True, gluon=gluon)
    assert not plan_off.tail_partition


@pytest.mark.parametrize("batch,heads,tokens,pdl,reserve", [
    (1, 8, 9, True, 3),      # GLM-5: 72 rows, three 32-row tree programs, one block a split
    (1, 16, 9, True, 3),     # 144 rows: five tree programs over two blocks a split
    (1, 8, 33, True, 3),     # 264 rows: nine over four blocks a split, of 33 splits
    (1, 8, 9, False, 0),     # no PDL: the tree kernel ends before the prefix kernel starts
    (4, 8, 9, True, 0),      # 12 tree programs, 12 late splits: more than 1/8 of the 33
    (1, 8, 8, True, 0),      # 64 rows: no row tail, no warp-specialized tile
])
def test_splits_left_to_the_tree_programs(batch, heads, tokens, pdl, reserve):
    """Where the warp-specialized tile runs with PDL, the last splits, those holding the prefix programs that
    start behind the tree kernel's, get late_split_tiles key tiles fewer (`late_keys`), unless they are over
    1/8 of the splits."""
    from ddtree_kernels.configs import HOPPER
    from ddtree_kernels.launcher import VerifyPlan, prefix_launches

    rows = heads * tokens
    blocks = sum(b for _, _, b in prefix_launches(HOPPER, rows, kv_fp8=False, v_from_k=True, gluon=True))
    splits = split_count(blocks * batch, 132, HOPPER.max_splits)
    plan = VerifyPlan(batch, heads, tokens, batch * tokens, 512, 64, splits, HOPPER, pdl=pdl, gluon=True)
    assert plan.split_reserve == reserve
    if reserve:
        tree_programs = plan.row_blocks(HOPPER.tree.block_m) * batch
        assert (reserve - 1) * blocks < tree_programs <= reserve * blocks and reserve * 8 <= splits
        assert plan.late_keys == HOPPER.late_split_tiles * plan.prefix_tile.block_n > 0
    else:
        assert plan.late_keys == 0


def test_both_gluon_wide_kernels_take_one_argument_list():
    """The launcher calls prefix_hopper's wide kernel or its warp-specialized form with the same arguments."""
    from ddtree_kernels.hopper import prefix as prefix_hopper

    if gluon_shared.unavailable_reason():
        pytest.skip(gluon_shared.unavailable_reason())
    from ddtree_kernels.hopper import prefix_ws as prefix_hopper_ws

    assert prefix_hopper_ws.prefix_wide_ws_kernel.arg_names == prefix_hopper.prefix_wide_hopper_kernel.arg_names
    assert "split_reserve" in prefix_hopper.prefix_wide_hopper_kernel.arg_names


def test_a_tile_and_its_fallback_plan_alike():
    """Where a Gluon tile does not run, its fallback takes its launches in the same plan: both must own as
    many rows a program and fill an SM with as many programs, or the splits and row blocks would be wrong."""
    from ddtree_kernels.configs import SHIPPED

    tiles = [(name, field, getattr(conf, field)) for name, conf in SHIPPED.items() for field in vars(conf)
             if hasattr(getattr(conf, field), "fallback")]
    with_fallback = [(name, field, t) for name, field, t in tiles if t.fallback is not None]
    assert {("sm120", f) for f in ("prefix", "prefix_fp8", "prefix_wide", "prefix_wide_fp8", "prefix_small_fp8")} <= {
        (name, field) for name, field, _ in with_fallback}
    for name, field, tile in with_fallback:
        assert (tile.fallback.block_m, tile.fallback.ctas_per_sm) == (tile.block_m, tile.ctas_per_sm), (name, field)
        assert tile.fallback.fallback is None and not tile.fallback.mma_v2, (name, field)


def test_with_fallbacks_swaps_exactly_the_tiles_that_have_one():
    """What runs without the Gluon tiles (the fit report compiles it, the CPU tests run it): every tile with a
    fallback replaced by it, every other field as it was."""
    import dataclasses

    from ddtree_kernels.configs import SM120

    plain = SM120.with_fallbacks()
    for field in dataclasses.fields(SM120):
        tile = getattr(SM120, field.name)
        expected = tile.fallback if getattr(tile, "fallback", None) is not None else tile
        assert getattr(plain, field.name) == expected, field.name
    assert plain.prefix.chunked and plain.prefix_fp8.keys_major and not plain.prefix_wide.mma_v2
    assert plain.with_fallbacks() == plain  # fallbacks have no fallback of their own


@pytest.mark.parametrize("config", [SM120, HOPPER], ids=["sm120", "hopper"])
def test_a_draft_models_narrow_heads_take_their_own_split_v_tile(config):
    """Keys of at most 128 in a separate V buffer (a DFlash drafter's GQA heads) take
    prefix_split_v_narrow_head, one block for the request's 96 rows; MLA's 576-wide split-V rows keep
    prefix_split_v, which the narrow-head tile would not fit in sm_120's shared memory."""
    narrow = plan_verify(1, 6, 16, 16, "cpu", d_v=128, d_rope=0, v_from_k=False, config=config, gpu=((12, 0), 188))
    assert narrow.prefix_launches() == ((config.prefix_split_v_narrow_head, 0, 1),)
    mla = plan_verify(1, 6, 16, 16, "cpu", d_v=512, d_rope=64, v_from_k=False, config=config, gpu=((12, 0), 188))
    assert mla.prefix_launches()[0][0] is config.prefix_split_v
