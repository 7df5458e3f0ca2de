"""The sweep's tile specs: each number names a Tile field by its place, the kernel and switches by name."""

from __future__ import annotations

import argparse

import pytest

from ddtree_kernels.plan_types import Tile
from ddtree_tools.sweep import _tile, sweep_table


def test_kernels_and_switches_are_named():
    assert _tile("32x32x8x2x1+latent_split") == Tile("prefix_latent_split", 32, 32, 8, 2, programs_per_sm=1)
    assert _tile("64x64x8x2x1+wgmma+keys_major") == Tile("hopper_wgmma", 64, 64, 8, 2, 1, keys_major=True)
    assert _tile("16x32x4x3") == Tile("prefix_general", 16, 32, 4, 3, programs_per_sm=2)  # the sweep's default


@pytest.mark.parametrize("spec, message", [
    ("16x32x8x2x1x0x0x0x1", "write MxNxWARPSxSTAGES"),  # the old positional switches
    ("16x32", "write MxNxWARPSxSTAGES"),
    ("16x32x4x3+mma_v2", "unknown switch mma_v2"),  # the kernel's old name
    ("16x32x4x3+chunked+wgmma", "two kernels"),
])
def test_bad_specs_name_the_form(spec, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        _tile(spec)


def test_a_sweep_is_a_rule_table():
    narrow, wide = _tile("16x32x4x3"), _tile("64x64x8x2x1+wgmma")
    table = sweep_table(narrow, wide=wide, tail_max=32, tail_partition=True, merge=(64, 32))
    assert [r.tile.kernel for r in table.rules] == ["hopper_wgmma", "prefix_general"]
    assert table.rules[0].tail == narrow and table.rules[0].tile.option("tail_partition")
    assert (table.merge_block_d, table.merge_block_s) == (64, 32)


def test_dsa_sweep_variants_replace_one_kernel_each():
    from ddtree_kernels.dsa.launcher import DSA_SM120
    from ddtree_tools.sweep_dsa import parse_tile, variants

    indexer = parse_tile("8x128x4x3x3", "indexer")
    assert indexer == Tile("indexer", 8, 128, 4, 3, programs_per_sm=3)
    args = argparse.Namespace(indexer=[indexer], collect=None, resolve=[parse_tile("1x8192x16x1", "resolve")],
                              attention=[parse_tile("16x16x4x2", "attention")])
    got = dict(variants(DSA_SM120, args))
    assert list(got) == ["default", "indexer 8x128x4x3x3", "resolve 1x8192x16x1x1", "attention 16x16x4x2x1"]
    assert got["default"] is DSA_SM120
    assert got["indexer 8x128x4x3x3"].indexer.kernel == DSA_SM120.indexer.kernel  # the kernel the entry names
    assert got["indexer 8x128x4x3x3"].topk_resolve == DSA_SM120.topk_resolve
    assert got["resolve 1x8192x16x1x1"].topk_resolve.block_n == 8192
    assert got["resolve 1x8192x16x1x1"].indexer == DSA_SM120.indexer
    assert got["attention 16x16x4x2x1"].attention == Tile(DSA_SM120.attention.kernel, 16, 16, 4, 2)
    assert got["attention 16x16x4x2x1"].attention_fp8 == DSA_SM120.attention_fp8  # the bf16 cache's tile only


@pytest.mark.parametrize("spec", ["16x128", "16x128x4x3x2+prefetch_q", "16x0x4x3", "axbxcxd"])
def test_bad_dsa_tiles_name_the_form(spec):
    from ddtree_tools.sweep_dsa import parse_tile

    with pytest.raises(argparse.ArgumentTypeError, match="MxNxWARPSxSTAGES"):
        parse_tile(spec, "indexer")
