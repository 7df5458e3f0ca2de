"""Which kernels a plan launches, as data and as text, for sm_120 and Hopper without either GPU."""

from __future__ import annotations

import dataclasses

import pytest

from ddtree_kernels.describe import describe, describe_table, main
from ddtree_kernels.launcher import plan_verify
from ddtree_kernels.registry import KERNELS
from ddtree_kernels.sm120.rules import SM120
from ddtree_kernels.target import Target


def _plan(heads: int, draft: int, gpu: str = "sm120", gluon: bool = True, **kw):
    return plan_verify(kw.pop("bs", 1), heads, draft, draft, Target.named(gpu, gluon=gluon), **kw)


@pytest.mark.parametrize("gluon", [True, False], ids=["gluon-triton", "other-triton"])
def test_sm120_runs_no_hopper_kernel(gluon):
    """sm_120 plans launch no wgmma kernel: a cache with V in K (16-bit or fp8) takes the latent-split Gluon tiles
    (mma.sync) with a Triton that builds them, and the rules after them where it does not: the chunked tl.dot
    tile for 16 bits, the keys-major tiles for fp8."""
    for heads, draft, fp8 in [(8, 9, False), (8, 9, True), (16, 33, False), (8, 1, True), (64, 9, False)]:
        plan = _plan(heads, draft, gluon=gluon, kv_fp8=fp8)
        kernels = [launch.kernel for launch in plan.launches()]
        fallback = "prefix_general" if fp8 else "prefix_chunked"
        latent = "prefix_latent_split_fp8" if fp8 else "prefix_latent_split"
        assert kernels[0] == "tree" and kernels[-1] == "merge"
        assert set(kernels[1:-1]) == {latent if gluon else fallback}, kernels
        # fp8 decode (up to 16 rows) takes the 16-key tile, two programs an SM; every other tile fills an SM
        resident = 2 if fp8 and heads * draft <= 16 else 1
        assert all(launch.programs_per_sm == resident for launch in plan.launches()[1:-1])


@pytest.mark.parametrize("fp8", [False, True])
def test_sm120_gluon_tiles_and_the_rules_after_them_share_the_plan(fp8):
    """The Gluon tiles and the tiles of the rules after them own as many rows a program, one program an SM: the
    same splits and row blocks, so only the kernels and their tiles differ. GLM-5's 72 rows: two 32-row blocks,
    and the 8 rows past them on a 16-row block in a second launch."""
    gluon = _plan(8, 9, kv_fp8=fp8).launches()[1:-1]
    fallback = _plan(8, 9, gluon=False, kv_fp8=fp8).launches()[1:-1]
    assert [launch.kernel for launch in gluon] == ["prefix_latent_split_fp8" if fp8 else "prefix_latent_split"] * 2
    assert [launch.kernel for launch in fallback] == ["prefix_general" if fp8 else "prefix_chunked"] * 2
    assert [launch.grid for launch in gluon] == [launch.grid for launch in fallback]
    assert [(launch.grid[0], launch.row_base) for launch in gluon] == [(2, 0), (1, 64)]
    assert [dict(launch.constexprs)["BLOCK_M"] for launch in gluon] == [32, 16]
    assert all((dict(launch.constexprs)["BLOCK_N"], launch.num_warps) == (32, 8) for launch in gluon)
    # grids are sized for the GPU planned for: the RTX PRO 6000's 188 SMs, not an H200's 132
    assert _plan(8, 9).num_splits != plan_verify(1, 8, 9, 9, Target.named("sm120", sms=132)).num_splits


def test_sm120_fp8_decode_takes_two_small_programs_an_sm():
    """With an fp8 cache, requests of up to 16 rows (decode at 8 or 16 heads) take the 16-key tile, two programs
    an SM, so twice the splits of the 16-row tile; the rule after it shares the plan. 24 rows take the 16-row
    tile again, and a 16-bit cache keeps the 16-row tile for decode too."""
    no_small = dataclasses.replace(SM120, rules=SM120.rules[2:])
    for heads, draft in [(8, 1), (16, 1), (8, 2)]:
        plan = _plan(heads, draft, kv_fp8=True)
        (launch,) = plan.launches()[1:-1]
        assert launch.kernel == "prefix_latent_split_fp8" and launch.programs_per_sm == 2
        assert (dict(launch.constexprs)["BLOCK_M"], dict(launch.constexprs)["BLOCK_N"]) == (16, 16)
        assert plan.num_splits == 2 * _plan(heads, draft, kv_fp8=True, table=no_small).num_splits
        (fallback,) = _plan(heads, draft, gluon=False, kv_fp8=True).launches()[1:-1]
        assert fallback.kernel == "prefix_general" and dict(fallback.constexprs)["KEYS_MAJOR"]
        assert (fallback.grid, fallback.programs_per_sm) == (launch.grid, 2)
        assert _plan(heads, draft).launches()[1].programs_per_sm == 1
    assert _plan(8, 3, kv_fp8=True).launches()[1].programs_per_sm == 1


def test_separate_values_on_sm120_take_the_general_kernel():
    """The latent-split and chunked tiles read values from the key tile; a separate V buffer takes prefix_general."""
    plan = _plan(8, 9, v_from_k=False)
    assert [launch.kernel for launch in plan.launches()[1:-1]] == ["prefix_general"]


def test_glm5_on_sm120_reads_the_prefix_three_times():
    """72 rows: two 32-row blocks and an 8-row tail on a 16-row block read each key tile three times (16-row
    blocks alone would read it five times)."""
    wide, tail = _plan(8, 9).launches()[1:-1]
    assert (wide.grid[0], tail.grid[0]) == (2, 1) and "BLOCK_M 32" in wide.tile and "BLOCK_M 16" in tail.tile


@pytest.mark.parametrize("target", [Target.interpreter(), Target.named("sm120"), Target.named("sm120", gluon=False),
                                    Target.named("sm90"), Target.named("sm90", gluon=False)], ids=str)
def test_launch_constexprs_are_what_the_kernel_is_compiled_with(target):
    """run_verify passes Launch.constexprs plus the call's own (KernelEntry.call_constexprs): the call's must be
    values run_verify has, so fit compiles exactly what runs; and each runtime argument needs a type for fit."""
    from ddtree_kernels.registry import ARG_TYPES

    for fp8, v_from_k in [(False, True), (True, True), (False, False)]:
        for heads, draft in [(8, 9), (8, 1), (8, 3)]:
            for launch in plan_verify(1, heads, draft, draft, target, kv_fp8=fp8, v_from_k=v_from_k).launches():
                entry = KERNELS[launch.kernel]
                if entry.fn is None:  # a Gluon kernel this Triton does not build; such targets never plan it
                    continue
                assert set(entry.call_constexprs(launch)) <= {"MASK_MODE", "DOT_FP32", "SCALE_FROM_PTR", "STORE_LSE"}
                assert {name for name, _ in launch.constexprs} <= entry.constexpr_names, launch.kernel
                assert set(entry.runtime) <= set(ARG_TYPES), launch.kernel
                assert {name for name, _ in launch.scalars} <= set(entry.runtime), launch.kernel
                variants = {name for variant in entry.compile_variants for name, _ in variant}
                assert set(entry.call_constexprs(launch)) == variants, launch.kernel


def test_description_names_the_target_table_rule_and_launches(capsys):
    text = describe(8, 9, gpu="sm120")
    lines = text.splitlines()
    assert "72 rows a request" in lines[0] and "table sm120 rule 3" in lines[0] and "on sm120 (188 SMs" in lines[0]
    assert len(lines) == 7 and lines[5].startswith("  rule 3.") and "tail rows" in lines[6]  # + wide and tail
    assert main(["--heads", "8", "--draft", "9", "--kv", "fp8", "--gpu", "sm120"]) == 0
    assert "fp8_e4m3 cache" in capsys.readouterr().out
    assert "prefix_chunked" in describe(8, 9, gpu="sm120", gluon=False)


def test_the_table_is_printed_in_the_order_it_is_read(capsys):
    assert main(["--table", "--gpu", "sm90"]) == 0
    out = capsys.readouterr().out
    assert out.strip() == describe_table("sm90")
    numbered = [line.split(".")[0].strip() for line in out.splitlines()[2:] if line[:3].strip().isdigit()]
    assert numbered == [str(i) for i in range(1, 11)] and "hopper_wgmma" in out.splitlines()[2]
    with pytest.raises(SystemExit):
        main(["--gpu", "sm120"])  # neither a call nor --table


def test_the_kernels_readme_opens_with_the_table_describe_prints():
    """kernels/README.md shows sm_120's table as `describe --table` prints it: a changed rule changes the doc."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "kernels" / "README.md").read_text()
    assert describe_table("sm120") in readme
    assert readme.index(describe_table("sm120")) < readme.index("## Use")
