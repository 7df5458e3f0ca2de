"""The sweep's tile specs: the shape by position, the kernel switches by name, old positional forms refused."""

from __future__ import annotations

import argparse

import pytest

from ddtree_kernels.configs import TileConfig
from ddtree_tools.sweep import _tile


def test_switches_are_named():
    assert _tile("32x32x8x2x1+mma_v2") == TileConfig(32, 32, 8, 2, ctas_per_sm=1, mma_v2=True)
    assert _tile("64x64x8x2x1+gluon+keys_major") == TileConfig(64, 64, 8, 2, 1, keys_major=True, gluon=True)
    assert _tile("16x32x4x3") == TileConfig(16, 32, 4, 3)  # programs an SM default as TileConfig says


@pytest.mark.parametrize("spec, message", [
    ("16x32x8x2x1x0x0x0x1", "write MxNxWARPSxSTAGES"),  # the old positional switches
    ("16x32", "write MxNxWARPSxSTAGES"),
    ("16x32x4x3+wgmma", "unknown switch wgmma"),
    ("16x32x4x3+fallback", "unknown switch fallback"),  # a field, but not a switch
])
def test_bad_specs_name_the_form(spec, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        _tile(spec)
