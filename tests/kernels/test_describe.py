"""Which kernels a plan launches, as data and as text, for sm_120 and Hopper without either GPU."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from ddtree_kernels import launcher, prefix_mma_v2
from ddtree_kernels.configs import SM120
from ddtree_kernels.describe import GPUS, describe, main
from ddtree_kernels.launcher import plan_verify


def _plan(heads: int, draft: int, gpu: str, **kw):
    return plan_verify(kw.pop("bs", 1), heads, draft, draft, "cpu", gpu=GPUS[gpu], **kw)


@pytest.fixture
def compiled(monkeypatch):
    """Plan as on a GPU, not under the interpreter (this session may be interpreting): the sm_120 Gluon
    tile is then chosen wherever the installed Triton builds it."""
    monkeypatch.setattr(launcher, "interpreting", lambda: False)
    plan_verify.cache_clear()
    yield
    plan_verify.cache_clear()


@pytest.mark.parametrize("gluon", [True, False], ids=["gluon-triton", "other-triton"])
def test_sm120_runs_no_hopper_kernel(compiled, monkeypatch, gluon):
    """sm_120 plans launch no wgmma kernel: a cache with V in K (16-bit or fp8) takes prefix_mma_v2's Gluon tiles
    (mma.sync) where this Triton builds them, and their fallbacks where it does not: the chunked tl.dot tile for
    16 bits, the keys-major tiles for fp8."""
    if gluon and prefix_mma_v2.unavailable_reason():
        pytest.skip(f"this Triton does not build the Gluon tile: {prefix_mma_v2.unavailable_reason()}")
    if not gluon:
        monkeypatch.setattr(prefix_mma_v2, "unavailable_reason", lambda: "an untested Triton")
    for heads, draft, fp8 in [(8, 9, False), (8, 9, True), (16, 33, False), (8, 1, True), (64, 9, False)]:
        plan = _plan(heads, draft, "sm120", kv_fp8=fp8)
        kernels = [launch.kernel for launch in plan.launches()]
        fallback = "prefix_split_kernel" if fp8 else "prefix_chunked_kernel"
        assert kernels[0] == "tree_block_kernel" and kernels[-1] == "merge_parts_kernel"
        assert set(kernels[1:-1]) == {"prefix_mma_v2_kernel" if gluon else fallback}, kernels
        # fp8 decode (up to 16 rows) takes the 16-key tile, two programs an SM; every other tile fills an SM
        resident = 2 if fp8 and heads * draft <= 16 else 1
        assert not plan.gluon and all(launch.ctas_per_sm == resident for launch in plan.launches()[1:-1])


@pytest.mark.parametrize("fp8", [False, True])
def test_sm120_gluon_tiles_and_their_fallbacks_share_the_plan(compiled, monkeypatch, fp8):
    """The Gluon tiles and the tiles they fall back to own as many rows a program, one program an SM: the same
    splits and row blocks, so only the kernels and their tiles differ. GLM-5's 72 rows: two 32-row blocks, and
    the 8 rows past them on a 16-row block in a second launch."""
    if prefix_mma_v2.unavailable_reason():
        pytest.skip(f"this Triton does not build the Gluon tile: {prefix_mma_v2.unavailable_reason()}")
    gluon = _plan(8, 9, "sm120", kv_fp8=fp8).launches()[1:-1]
    monkeypatch.setattr(prefix_mma_v2, "unavailable_reason", lambda: "an untested Triton")
    plan_verify.cache_clear()
    fallback = _plan(8, 9, "sm120", kv_fp8=fp8).launches()[1:-1]
    assert [launch.kernel for launch in gluon] == ["prefix_mma_v2_kernel"] * 2
    assert [launch.kernel for launch in fallback] == ["prefix_split_kernel" if fp8 else "prefix_chunked_kernel"] * 2
    assert [launch.grid for launch in gluon] == [launch.grid for launch in fallback]
    assert [(launch.grid[0], launch.row_base) for launch in gluon] == [(2, 0), (1, 64)]
    assert [dict(launch.constexprs)["BLOCK_M"] for launch in gluon] == [32, 16]
    assert all((dict(launch.constexprs)["BLOCK_N"], launch.num_warps) == (32, 8) for launch in gluon)
    # grids are sized for the GPU planned for: the RTX PRO 6000's 188 SMs, not the machine's
    assert _plan(8, 9, "sm120").num_splits != plan_verify(1, 8, 9, 9, "cpu", gpu=((12, 0), 132)).num_splits


def test_sm120_fp8_decode_takes_two_small_programs_an_sm(compiled, monkeypatch):
    """With an fp8 cache, requests of up to 16 rows (decode at 8 or 16 heads) take the 16-key tile, two programs
    an SM, so twice the splits of the 16-row tile; its fallback shares the plan. 24 rows take the 16-row tile
    again, and a 16-bit cache keeps the 16-row tile for decode too."""
    if prefix_mma_v2.unavailable_reason():
        pytest.skip(f"this Triton does not build the Gluon tile: {prefix_mma_v2.unavailable_reason()}")
    no_small = dataclasses.replace(SM120, prefix_small_fp8=None)
    for heads, draft in [(8, 1), (16, 1), (8, 2)]:
        plan = _plan(heads, draft, "sm120", kv_fp8=True)
        (launch,) = plan.launches()[1:-1]
        assert launch.kernel == "prefix_mma_v2_kernel" and launch.ctas_per_sm == 2
        assert (dict(launch.constexprs)["BLOCK_M"], dict(launch.constexprs)["BLOCK_N"]) == (16, 16)
        assert plan.num_splits == 2 * _plan(heads, draft, "sm120", kv_fp8=True, config=no_small).num_splits
        with monkeypatch.context() as m:
            m.setattr(prefix_mma_v2, "unavailable_reason", lambda: "an untested Triton")
            plan_verify.cache_clear()
            (fallback,) = _plan(heads, draft, "sm120", kv_fp8=True).launches()[1:-1]
        plan_verify.cache_clear()
        assert fallback.kernel == "prefix_split_kernel" and dict(fallback.constexprs)["KEYS_MAJOR"]
        assert (fallback.grid, fallback.ctas_per_sm) == (launch.grid, 2)
        assert _plan(heads, draft, "sm120").launches()[1].ctas_per_sm == 1
    assert _plan(8, 3, "sm120", kv_fp8=True).launches()[1].ctas_per_sm == 1


def test_separate_values_on_sm120_fall_back_to_the_split_kernel():
    """prefix_chunked_kernel reads values from the key tile; a separate V buffer takes prefix_split_kernel."""
    plan = _plan(8, 9, "sm120", v_from_k=False)
    assert [launch.kernel for launch in plan.launches()[1:-1]] == ["prefix_split_kernel"]


def test_glm5_on_sm120_reads_the_prefix_three_times():
    """72 rows: two 32-row blocks and an 8-row tail on a 16-row block read each key tile three times (16-row
    blocks alone would read it five times)."""
    wide, tail = _plan(8, 9, "sm120").launches()[1:-1]
    assert (wide.grid[0], tail.grid[0]) == (2, 1) and "BLOCK_M 32" in wide.tile and "BLOCK_M 16" in tail.tile


@pytest.mark.parametrize("interpreted", [True, False])
def test_launch_constexprs_are_what_the_kernel_is_compiled_with(monkeypatch, interpreted):
    """run_verify passes Launch.constexprs plus the call's own (launcher.CALL_CONSTEXPRS): together they
    must name every constexpr parameter of the kernel, so fit compiles exactly what runs (planned as
    under the interpreter, and as on a GPU, where sm_120's Gluon tile is chosen)."""
    monkeypatch.setattr(launcher, "interpreting", lambda: interpreted)
    plan_verify.cache_clear()
    from ddtree_kernels.launcher import CALL_CONSTEXPRS, KERNELS

    for gpu, fp8, v_from_k in [("sm120", False, True), ("sm120", True, True), ("sm120", False, False),
                               ("sm90", False, True)]:
        for launch in _plan(8, 9, gpu, kv_fp8=fp8, v_from_k=v_from_k).launches():
            fn = KERNELS[launch.kernel]
            if fn is None:  # a Gluon kernel this Triton does not build; such plans never launch it
                continue
            params = inspect.signature(getattr(fn, "fn", fn)).parameters.values()  # JIT or interpreted
            constexprs = {p.name for p in params if "constexpr" in str(p.annotation)} - {"num_warps"}
            given = {name for name, _ in launch.constexprs} | set(CALL_CONSTEXPRS[launch.kernel])
            assert given == constexprs, (launch.kernel, given ^ constexprs)


def test_description_names_config_and_launches(capsys):
    text = describe(8, 9, gpu="sm120")
    lines = text.splitlines()
    assert "72 rows a request" in lines[0] and "config sm120" in lines[0] and len(lines) == 5  # + wide and tail
    assert main(["--heads", "8", "--draft", "9", "--kv", "fp8", "--gpu", "sm120"]) == 0
    assert "fp8_e4m3 cache" in capsys.readouterr().out
