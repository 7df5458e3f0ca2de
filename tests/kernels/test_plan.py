"""The split count: whole waves of resident programs, never a lone program in a tail wave."""

from __future__ import annotations

import dataclasses
import math

import pytest

from ddtree_kernels import gluon_shared
from ddtree_kernels.hopper.launch import LATE_SPLIT_TILES, wgmma_supports
from ddtree_kernels.hopper.rules import HOPPER
from ddtree_kernels.launcher import merge_tile, plan_verify, split_count
from ddtree_kernels.plan_types import Rule, VerifyShape
from ddtree_kernels.registry import KERNELS
from ddtree_kernels.selection import TABLES, runs, table_for
from ddtree_kernels.sm120.rules import SM120
from ddtree_kernels.target import Target


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


H200 = Target.named("sm90")  # a Hopper GPU with a Triton that builds the Gluon tiles
HOPPER_NO_GLUON = Target.named("sm90", gluon=False)
RTX = Target.named("sm120")


def _rule_number(plan) -> int:
    return plan.table.rules.index(plan.rule) + 1


@pytest.mark.parametrize("target,rule", [(Target.named("sm120"), 3), (Target.named("sm120", gluon=False), 4),
                                         (Target.interpreter(), 4), (Target.named("sm90"), 3),
                                         (Target.named("sm90", gluon=False), 5)])
def test_the_plan_is_the_first_rule_whose_kernel_runs(target, rule):
    """GLM-5's 72 rows on a 16-bit cache: the first matching rule, skipping any whose kernel does not run on the
    target (the Gluon tiles without Gluon or under the interpreter), whichever table the target uses."""
    plan = plan_verify(1, 8, 9, 9, target)
    assert plan.table is table_for(target) and _rule_number(plan) == rule
    assert all(runs(r, target, plan.shape) is False or not r.matches(72, kv_fp8=False, v_from_k=True, key_width=576)
               for r in plan.table.rules[: rule - 1])


def test_every_table_takes_every_call():
    """A call no rule takes would fail at its first verify: each table ends in rules on prefix_general, which
    runs everywhere, for each cache dtype and value layout."""
    for table in TABLES.values():
        for target in (Target.interpreter(), Target.named("sm120", gluon=False), Target.named("sm90", gluon=False)):
            for fp8 in (False, True):
                for v_from_k in (True, False):
                    for rows in (1, 16, 17, 64, 72, 600):
                        plan = plan_verify(1, 1, rows, rows, target, table=table, kv_fp8=fp8, v_from_k=v_from_k)
                        assert plan.rule.tile.kernel == "prefix_general" or v_from_k


def test_a_call_no_rule_takes_names_the_table_and_the_fix():
    table = dataclasses.replace(SM120, rules=SM120.rules[:1])  # fp8 decode only
    with pytest.raises(ValueError, match=r"no rule of table sm120 takes a 16-bit cache.*add one"):
        plan_verify(1, 8, 9, 9, Target.interpreter(), table=table)


@pytest.mark.parametrize("kv_fp8,v_from_k", [(False, True), (True, True), (False, False)])
def test_plan_sizes_its_grid_by_the_tile_that_runs(kv_fp8, v_from_k):
    """GLM-5's 72 rows a request take Hopper's 64-row tiles (bf16 or fp8) with an 8-row tail, but the 32-row
    tile where V is apart from K in bf16: the split count must come from the tiles launched, or a call
    leaves a tail wave. (Four SMs, Hopper's table without Gluon.)"""
    target = dataclasses.replace(HOPPER_NO_GLUON, sms=4)
    plan = plan_verify(1, 8, 9, 9, target, kv_fp8=kv_fp8, v_from_k=v_from_k)
    tile = plan.prefix_tile
    if v_from_k:
        # 64 rows on the wide tile (one an SM, 2 half-SM shares) beside an 8-row tail on the 16-row tile
        # (two an SM, 1 share): 3 shares a split on 8 half-SM slots, so 8 splits fill exactly 3 waves.
        assert tile.block_m == 64 and plan.tail_rows == 8 and plan.num_splits == 8
    else:
        # 72 rows as three 32-row programs a split, one an SM: 4 splits fill exactly 3 waves of 4.
        assert plan.tail_rows == 0 and tile.block_m == 32 and tile.programs_per_sm == 1
        assert plan.num_splits == 4


@pytest.mark.parametrize("heads,tokens,launches", [
    (8, 9, [(64, 0, 1), (16, 64, 1)]),     # GLM-5: 72 = 64 + an 8-row tail
    (16, 9, [(64, 0, 2), (16, 128, 1)]),   # 144 = 128 + 16
    (8, 33, [(64, 0, 4), (16, 256, 1)]),   # 264 = 256 + 8
    (8, 12, [(64, 0, 1), (16, 64, 2)]),    # 96 = 64 + 32: still a tail
    (4, 25, [(64, 0, 2)]),                 # 100 = 64 + 36: too many, one more wide block
    (64, 9, [(64, 0, 9)]),                 # 576: whole wide blocks
    (8, 1, [(16, 0, 1)]),                  # decode: the 16-row tile alone
])
@pytest.mark.parametrize("kv_fp8", [False, True])
def test_row_tail_goes_to_the_tail_tile(heads, tokens, launches, kv_fp8):
    """A few rows past the last whole 64-row block would waste most of a wide block (and its key gather): up to
    tail_max_rows of them run on the rule's tail tile in a second launch, the fp8 one for an fp8 cache."""
    plan = plan_verify(1, heads, tokens, tokens, HOPPER_NO_GLUON, kv_fp8=kv_fp8)
    got = [(tile.block_m, row_base, blocks) for tile, row_base, blocks in plan.prefix_launches()]
    assert got == launches
    assert all(tile.keys_major == kv_fp8 for tile, _, _ in plan.prefix_launches())
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
    (8, 1, False, 0),    # decode: the keys-major tile
    (8, 9, True, 8),     # fp8: the wgmma fp8 tile (widened in shared memory) spreads it the same way
    (16, 33, True, 2),
])
def test_wgmma_wide_tile_spreads_a_short_tail_over_its_blocks(heads, tokens, kv_fp8, fused):
    """Where the wgmma tile runs, the rows past its whole blocks ride in those blocks, on the key tiles they
    gather anyway, instead of a second launch that reads the prefix again; each block then owns BLOCK_M + fused
    rows, and together they own every row."""
    rows = heads * tokens
    plan = plan_verify(1, heads, tokens, tokens, H200, kv_fp8=kv_fp8)
    assert plan.fused_tail_rows == fused
    assert plan_verify(1, heads, tokens, tokens, HOPPER_NO_GLUON, kv_fp8=kv_fp8).fused_tail_rows == 0
    # An fp8 cache with separate V has no wgmma tile: prefix_general's wide fp8 tile and a tail launch.
    assert plan_verify(1, heads, tokens, tokens, H200, kv_fp8=True, v_from_k=False).fused_tail_rows == 0
    if fused:
        wide = plan.rule.tile
        blocks = rows // wide.block_m
        assert plan.prefix_launches() == ((wide, 0, blocks),)
        assert (blocks - 1) * (64 + fused) < rows <= blocks * (64 + fused)  # every row, no empty block
        assert fused <= plan.rule.fused_tail_max_rows
        (launch,) = plan.launches()[1:-1]
        assert dict(launch.scalars)["row_stride"] == 64 + fused


@pytest.mark.parametrize("heads,tokens,kv_fp8,tail_n", [(8, 1, False, 8), (8, 1, True, 8), (4, 2, False, 8),
                                                        (2, 3, True, 8), (1, 1, False, 8), (16, 1, False, 16),
                                                        (8, 2, True, 16), (3, 3, False, 16)])
def test_wgmma_keys_major_tile_takes_requests_of_a_few_rows(heads, tokens, kv_fp8, tail_n):
    """Where the wgmma tile runs, a request of at most 16 rows (decode at 8 or 16 heads) takes its keys-major
    form: one launch, one block a request, no 64-row block (BLOCK_M 0) and its rows as wgmma's N (TAIL_N: 8, or
    16 past 8 rows). Without Gluon, or with V apart, prefix_general's tiles."""
    rows = heads * tokens
    plan = plan_verify(1, heads, tokens, tokens, H200, kv_fp8=kv_fp8)
    tile = plan.rule.tile
    assert tile.kernel == "hopper_wgmma" and tile.keys_major and rows <= tile.block_m
    assert plan.prefix_launches() == ((tile, 0, 1),) and plan.fused_tail_rows == 0
    (launch,) = plan.launches()[1:-1]
    assert (dict(launch.constexprs)["BLOCK_M"], dict(launch.constexprs)["TAIL_N"]) == (0, tail_n)
    assert dict(launch.scalars)["row_stride"] == rows
    assert plan_verify(1, heads, tokens, tokens, HOPPER_NO_GLUON, kv_fp8=kv_fp8).rule.tile.kernel == "prefix_general"
    assert plan_verify(1, heads, tokens, tokens, H200, kv_fp8=kv_fp8, v_from_k=False).rule.tile.kernel == \
        "prefix_general"


@pytest.mark.parametrize("heads,tokens,kv_fp8", [(8, 3, False), (17, 1, True), (8, 4, False), (8, 7, True),
                                                 (9, 7, False)])
def test_wgmma_wide_tile_takes_17_to_63_rows_as_one_masked_block(heads, tokens, kv_fp8):
    """A request past the keys-major tile's 16 rows and short of a whole 64-row block takes the wgmma wide tile
    as one block with its missing rows masked (reading the prefix once), not a 16-row tile once every 16 rows."""
    plan = plan_verify(1, heads, tokens, tokens, H200, kv_fp8=kv_fp8)
    assert 17 <= plan.rows < 64 and plan.rule.rows[0] == 17
    assert plan.prefix_launches() == ((plan.rule.tile, 0, 1),) and plan.rule.tile.block_m == 64
    (launch,) = plan.launches()[1:-1]
    assert (dict(launch.constexprs)["BLOCK_M"], dict(launch.constexprs)["TAIL_N"]) == (64, 0)
    assert plan_verify(1, heads, tokens, tokens, HOPPER_NO_GLUON, kv_fp8=kv_fp8).rule.tile.block_m == 16


@pytest.mark.parametrize("version,runs", [("3.5.1", False), ("3.6.0", True), ("3.9.0", True),
                                          ("3.10.0", False), ("4.0.0", False)])
def test_gluon_kernel_only_on_the_triton_releases_it_is_checked_on(version, runs):
    """Gluon renames things between releases: outside the checked range a target has no Gluon tiles and the
    reason names the range (and where to widen it)."""
    reason = gluon_shared.unavailable_reason(version)
    assert (reason == "") == runs
    if not runs:
        assert version in reason and "TESTED_TRITON" in reason


def test_wgmma_tile_only_for_hopper_and_its_cache_layout():
    glm5 = VerifyShape(1, 8, 9, 9)
    assert not wgmma_supports(Target.interpreter(), glm5)  # no GPU
    assert not wgmma_supports(RTX, glm5)  # sm_120: no wgmma
    assert not wgmma_supports(HOPPER_NO_GLUON, glm5)  # a Triton outside TESTED_TRITON
    assert not wgmma_supports(H200, dataclasses.replace(glm5, v_from_k=False))
    assert not wgmma_supports(H200, dataclasses.replace(glm5, d_rope=32))
    assert wgmma_supports(H200, glm5) and wgmma_supports(H200, dataclasses.replace(glm5, kv_fp8=True))
    assert not wgmma_supports(dataclasses.replace(H200, interpreted=True), glm5)  # nothing compiles there


@pytest.mark.parametrize("parts", [2, 17, 65, 129, 258, 513, 2000])
def test_merge_tile_covers_the_parts_within_its_register_budget(parts):
    """One step over every part where the budget allows; never more values than the budget."""
    block_d, block_s = merge_tile(HOPPER, parts)
    budget = HOPPER.merge_block_d * HOPPER.merge_block_s
    assert block_d * block_s <= budget
    assert block_d >= 8 and block_d & (block_d - 1) == 0 and block_s & (block_s - 1) == 0
    if parts <= budget // 8:
        assert block_s >= parts


def test_programmatic_dependent_launch_only_where_it_exists():
    """PDL needs sm_90+ and real PTX: never under the interpreter; the table may turn it off."""
    assert not Target.interpreter().pdl and not plan_verify(1, 8, 9, 9, Target.interpreter(), table=HOPPER).pdl
    assert plan_verify(1, 8, 9, 9, RTX).pdl and plan_verify(1, 8, 9, 9, H200).pdl
    assert not plan_verify(1, 8, 9, 9, H200, table=dataclasses.replace(HOPPER, pdl=False)).pdl


@pytest.mark.parametrize("heads,tokens,kv_fp8,target,partition", [
    (8, 9, False, H200, True),     # GLM-5: 64 rows + an 8-row tail, bf16
    (16, 9, False, H200, True),    # two blocks of 72
    (8, 33, False, H200, True),    # four blocks of 66
    (8, 9, True, H200, False),     # fp8: the wgmma kernel widens each tile in the block's stream
    (8, 8, False, H200, False),    # 64 rows: no tail
    (8, 3, False, H200, False),    # 24 rows: one masked block, no tail
    (8, 1, False, H200, False),    # decode: the keys-major tile
    (8, 9, False, HOPPER_NO_GLUON, False),   # no Gluon here
])
def test_row_tail_takes_a_warpgroup_of_its_own_where_it_has_rows(heads, tokens, kv_fp8, target, partition):
    """Hopper runs a wgmma wide block's row tail on a partition of its own (prefix_wgmma_ws) for a 16-bit
    cache, where its tile asks for it (`tail_partition`); every other plan keeps its kernel."""
    plan = plan_verify(1, heads, tokens, tokens, target, kv_fp8=kv_fp8)
    assert ("hopper_wgmma_ws" in [launch.kernel for launch in plan.launches()]) is partition
    rules = tuple(dataclasses.replace(r, tile=dataclasses.replace(r.tile, options=())) for r in HOPPER.rules)
    plan_off = plan_verify(1, heads, tokens, tokens, target, kv_fp8=kv_fp8,
                           table=dataclasses.replace(HOPPER, rules=rules))
    assert "hopper_wgmma_ws" not in [launch.kernel for launch in plan_off.launches()]


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
    start behind the tree kernel's, get LATE_SPLIT_TILES key tiles fewer (`late_keys`), unless they are over
    1/8 of the splits."""
    table = dataclasses.replace(HOPPER, pdl=pdl)
    rows = heads * tokens
    probe = plan_verify(batch, heads, tokens, batch * tokens, H200, table=table)
    blocks = sum(b for _, _, b in probe.prefix_launches())
    splits = split_count(blocks * batch, 132, HOPPER.max_splits)
    plan = plan_verify(batch, heads, tokens, batch * tokens, H200, table=table, num_splits=splits)
    scalars = dict(plan.launches()[1].scalars)
    assert scalars["split_reserve"] == reserve
    if reserve:
        tree_programs = plan.row_blocks(HOPPER.tree.block_m) * batch
        assert (reserve - 1) * blocks < tree_programs <= reserve * blocks and reserve * 8 <= splits
        assert scalars["late_keys"] == LATE_SPLIT_TILES * plan.prefix_tile.block_n > 0
    else:
        assert scalars["late_keys"] == 0
    assert rows == plan.rows


def test_both_wgmma_kernels_take_one_argument_list():
    """hopper_wgmma's launch picks the tile or its warp-specialized form: both must take the same arguments."""
    if gluon_shared.unavailable_reason():
        pytest.skip(gluon_shared.unavailable_reason())
    assert KERNELS["hopper_wgmma"].runtime == KERNELS["hopper_wgmma_ws"].runtime
    assert "split_reserve" in KERNELS["hopper_wgmma"].runtime


def test_a_gluon_rule_and_the_rule_after_it_plan_alike():
    """Where a Gluon tile does not run, the next matching rule takes its calls: on sm_120 both must own as many
    rows a program and fill an SM with as many programs (and have the same tail), or the splits and row blocks
    would differ between a Triton with Gluon and one without."""
    for number, rule in enumerate(SM120.rules):
        if not KERNELS[rule.tile.kernel].gluon:
            continue
        after = SM120.rules[number + 1]
        assert (after.cache, after.rows) == (rule.cache, rule.rows) and after.values in (rule.values, "any"), number
        for a, b in ((rule.tile, after.tile), (rule.tail, after.tail)):
            assert (a is None) == (b is None)
            if a is not None:
                assert (a.block_m, a.programs_per_sm) == (b.block_m, b.programs_per_sm), number
                assert not KERNELS[b.kernel].gluon


@pytest.mark.parametrize("table", [SM120, HOPPER], ids=["sm120", "sm90"])
def test_a_draft_models_narrow_heads_take_their_own_split_v_tile(table):
    """Keys of at most 128 in a separate V buffer (a DFlash drafter's GQA heads) take the 128-row tile, one
    block for the request's 96 rows; MLA's 576-wide split-V rows keep the 32-row tile, which the narrow-head
    tile would not fit in sm_120's shared memory."""
    narrow = plan_verify(1, 6, 16, 16, RTX, d_v=128, d_rope=0, v_from_k=False, table=table)
    assert [(t.block_m, t.block_n, r, b) for t, r, b in narrow.prefix_launches()] == [(128, 64, 0, 1)]
    mla = plan_verify(1, 6, 16, 16, RTX, d_v=512, d_rope=64, v_from_k=False, table=table)
    assert [(t.block_m, t.block_n) for t, _, _ in mla.prefix_launches()] == [(32, 16)]


def test_rules_refuse_what_they_cannot_mean():
    with pytest.raises(ValueError, match="cache must be one of"):
        Rule("bf16", "in keys", (1, None), SM120.rules[0].tile)
    with pytest.raises(ValueError, match="tail tile and tail_max_rows together"):
        Rule("fp8", "in keys", (64, None), SM120.rules[0].tile, tail_max_rows=32)
