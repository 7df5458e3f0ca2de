"""Which kernels a plan launches, as data and as text, for sm_120 and Hopper without either GPU."""

from __future__ import annotations

import inspect

from ddtree_kernels.describe import GPUS, describe, main
from ddtree_kernels.launcher import plan_verify


def _plan(heads: int, draft: int, gpu: str, **kw):
    return plan_verify(kw.pop("bs", 1), heads, draft, draft, "cpu", gpu=GPUS[gpu], **kw)


def test_sm120_runs_only_the_portable_triton_kernels():
    for heads, draft, fp8 in [(8, 9, False), (8, 9, True), (16, 33, False), (8, 1, True), (64, 9, False)]:
        plan = _plan(heads, draft, "sm120", kv_fp8=fp8)
        kernels = [launch.kernel for launch in plan.launches()]
        assert kernels[0] == "tree_block_kernel" and kernels[-1] == "merge_parts_kernel"
        # no Gluon, no wgmma: the chunked tile for a 16-bit cache, the keys-major tiles for fp8
        assert set(kernels[1:-1]) == {"prefix_split_kernel" if fp8 else "prefix_chunked_kernel"}, kernels
        assert not plan.gluon and all(launch.ctas_per_sm == 1 for launch in plan.launches()[1:-1])
    # grids are sized for the GPU planned for: the RTX PRO 6000's 188 SMs, not the machine's
    assert _plan(8, 9, "sm120").num_splits != plan_verify(1, 8, 9, 9, "cpu", gpu=((12, 0), 132)).num_splits


def test_separate_values_on_sm120_fall_back_to_the_split_kernel():
    """prefix_chunked_kernel reads values from the key tile; a separate V buffer takes prefix_split_kernel."""
    plan = _plan(8, 9, "sm120", v_from_k=False)
    assert [launch.kernel for launch in plan.launches()[1:-1]] == ["prefix_split_kernel"]


def test_glm5_on_sm120_reads_the_prefix_once_per_16_row_block():
    (prefix,) = [launch for launch in _plan(8, 9, "sm120").launches() if launch.kernel == "prefix_chunked_kernel"]
    assert prefix.grid[0] == 5 and "BLOCK_M 16" in prefix.tile  # 72 rows: five reads of each key tile


def test_launch_constexprs_are_what_the_kernel_is_compiled_with():
    """run_verify passes Launch.constexprs plus the call's own (launcher.CALL_CONSTEXPRS): together they
    must name every constexpr parameter of the kernel, so fit compiles exactly what runs."""
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
    assert "72 rows a request" in lines[0] and "config sm120" in lines[0] and len(lines) == 4
    assert main(["--heads", "8", "--draft", "9", "--kv", "fp8", "--gpu", "sm120"]) == 0
    assert "fp8_e4m3 cache" in capsys.readouterr().out
