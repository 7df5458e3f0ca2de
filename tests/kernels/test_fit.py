"""Every launch of every rule table compiles for sm_120 and sm_90 and fits there.

Runs `python -m ddtree_tools.fit --json` in a child process: offline compilation
needs the real Triton JIT, and this test session may have TRITON_INTERPRET=1 set.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddtree_kernels import gluon_shared
from ddtree_kernels.selection import TABLES
from ddtree_kernels.sm120.rules import SM120_E4M3
from ddtree_kernels.target import SHARED_MEMORY_LIMIT

SM120_SHARED_MEMORY = SHARED_MEMORY_LIMIT[(12, 0)]


@pytest.fixture(scope="module")
def fit_report() -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    kernels = str(Path(__file__).resolve().parents[2] / "kernels")  # ddtree_tools sits beside the package
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [kernels, env.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "ddtree_tools.fit", "--json"], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.stdout, f"fit produced no report:\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout)


def test_every_table_and_variant_was_compiled_for_both_targets(fit_report):
    seen = {(r["table"], r["target"], r["kernel"]) for r in fit_report}
    for name in TABLES:
        for target in ("sm_120", "sm_90"):
            for kernel in ("prefix", "tree", "merge"):
                assert (name, target, kernel) in seen
    assert ("sm120", "sm_120", "prefix_chunked") in seen  # the 16-bit rule without Gluon
    if not gluon_shared.unavailable_reason():
        assert {("sm120", "sm_120", "prefix_latent_split"), ("sm120", "sm_120", "prefix_latent_split_fp8")} <= seen
    assert not [r for r in fit_report if r["error"]], [r for r in fit_report if r["error"]]


def test_hopper_wgmma_tile_is_compiled_where_triton_builds_it(fit_report):
    """Hopper's table runs the wgmma tile (bf16 and fp8) on the Triton releases in gluon_shared.TESTED_TRITON:
    there both forms of each (with and without the fused row tail), and its keys-major form (8 and 16 rows),
    and the bf16 wide tile with its row tail on a warpgroup of its own (prefix_wgmma_ws: 12 warps), must
    compile and fit sm_90 one program an SM; elsewhere the fit report leaves them out. A bf16 wide tile with
    a row tail always takes the warp-specialized form, so no plan launches its one-stream form."""

    gluon = [r for r in fit_report if r["kernel"].startswith("prefix_wgmma")]
    if gluon_shared.unavailable_reason():
        assert not gluon
        return
    assert sorted(r["variant"] for r in gluon) == ["kv=bf16,v_from_k=True,narrow,rows=16",
                                                   "kv=bf16,v_from_k=True,narrow,rows=8",
                                                   "kv=bf16,v_from_k=True,wide,tail-partition",
                                                   "kv=bf16,v_from_k=True,wide,tail=0",
                                                   "kv=fp8e4nv,v_from_k=True,narrow,rows=16",
                                                   "kv=fp8e4nv,v_from_k=True,narrow,rows=8",
                                                   "kv=fp8e4nv,v_from_k=True,wide,tail=0",
                                                   "kv=fp8e4nv,v_from_k=True,wide,tail=8"]
    assert all(r["table"] == "sm90" and r["target"] == "sm_90" and r["fits"] for r in gluon), gluon
    assert all(r["resident_programs"] >= 1 for r in gluon), gluon
    ws = [r for r in gluon if r["kernel"] == "prefix_wgmma_ws"]
    assert [r["num_warps"] for r in ws] == [12], ws  # the block's 8 warps and the tail's 4


def test_dependent_launch_chain_is_compiled_in(fit_report):
    """With programmatic dependent launch the merge must not read partials before every tree and
    prefix program is done. The tree kernel runs first and lets the prefix launch early without
    waiting on anything; each prefix launch lets the next one launch early and ends waiting on the
    grid before it; the merge waits before reading."""
    for r in fit_report:
        where = f"{r['table']} {r['target']} {r['kernel']} {r['variant']}"
        if r["kernel"].startswith("dsa:"):  # the DSA verify launches in stream order, without PDL
            continue
        if r["kernel"].startswith("prefix"):
            assert r["launch_dependents"] >= 1 and r["grid_waits"] >= 1, where
        elif r["kernel"] == "tree":
            assert r["launch_dependents"] >= 1 and r["grid_waits"] == 0, where
        else:
            assert r["grid_waits"] >= 1, where


def test_sm120_ptx_has_no_hopper_or_datacenter_blackwell_instructions(fit_report):
    """sm_120 has mma.sync but no wgmma, setmaxnreg or tcgen05: none may appear in what it launches."""
    sm120 = [r for r in fit_report if r["target"] == "sm_120" and r["must_fit"]]
    assert sm120 and all("hopper_only" in r for r in sm120)
    assert [r for r in sm120 if r["hopper_only"]] == []
    gluon = [r for r in fit_report if r["target"] == "sm_90" and r["kernel"].startswith("prefix_wgmma")]
    assert all(r["hopper_only"] > 0 for r in gluon)  # the count sees wgmma where it is


def test_sm120_shared_memory_and_no_spills(fit_report):
    sm120 = [r for r in fit_report if r["target"] == "sm_120" and r["must_fit"]]
    assert sm120
    for r in sm120:
        assert r["shared"] <= SM120_SHARED_MEMORY, f"{r['table']} {r['kernel']} {r['variant']}: {r['shared']} B"
        assert r["stack"] == 0 and r["local"] == 0, f"{r['table']} {r['kernel']} {r['variant']} spills"


def test_every_launch_a_target_can_plan_fits_it(fit_report):
    bad = [r for r in fit_report if r["must_fit"] and not r["fits"]]
    assert not bad, bad


def test_prefix_tiles_declare_the_occupancy_they_compile_to(fit_report):
    """The planner sizes the grid in waves of `programs_per_sm` programs an SM; a wrong figure
    leaves a tail wave (one program past a full wave doubles the call) or an idle half-GPU."""
    prefix = [r for r in fit_report if r["kernel"].startswith("prefix") and r["must_fit"]]
    assert prefix
    for r in prefix:
        if r["table"] == SM120_E4M3.name:
            # The opt-in e4m3 table (no target plans with it) compiles to 155 registers on Triton 3.9 (one program
            # an SM) and 128 on 3.6 (two): declaring one is safe on both (no tail wave, at worst a half-full SM).
            assert r["declared_programs_per_sm"] <= r["resident_programs"], r
            continue
        assert r["declared_programs_per_sm"] == r["resident_programs"], (
            f"{r['table']} {r['target']} {r['variant']}: declares {r['declared_programs_per_sm']} programs an SM, "
            f"compiles to {r['resident_programs']} ({r['registers']} registers, {r['shared']} B shared)"
        )


def test_each_launch_reports_its_machine_code(fit_report):
    """The SASS digest that tells a refactor which changed the code the GPU runs from one that did not
    (`python -m ddtree_tools.fit --sass DIR` writes the text to diff)."""
    import re

    compiled = [r for r in fit_report if not r["error"]]
    assert compiled and all(re.fullmatch(r"[0-9a-f]{64}", r["sass_sha256"]) for r in compiled)
    trees = {r["variant"]: r["sass_sha256"] for r in compiled
             if (r["table"], r["target"], r["kernel"]) == ("sm120", "sm_120", "tree")}
    assert len(trees) == 3 and len(set(trees.values())) == 3  # each mask layout is its own program


def test_each_sm120_prefix_launch_names_its_mma_sync_forms(fit_report):
    """fit reports the mma.sync forms in each launch's PTX: on sm_120 every prefix launch multiplies with one (no
    wgmma there), a 16-bit bf16 cache with m16n8k16 on bf16, and the field is what an fp8 MMA would be checked by."""
    sm120 = [r for r in fit_report if r["target"] == "sm_120" and r["must_fit"] and r["kernel"].startswith("prefix")]
    assert sm120
    for r in sm120:
        where = f"{r['table']} {r['kernel']} {r['variant']}"
        assert r["mma"] and all(form.startswith("m16n8k") for form in r["mma"]), where
        if r["variant"].startswith("kv=bf16"):
            assert "m16n8k16.f32.bf16.bf16.f32" in r["mma"], (where, r["mma"])


def test_opt_in_e4m3_tile_multiplies_in_e4m3_on_sm120_only(fit_report):
    """The opt-in fp8 tile (sm120/rules.SM120_E4M3) fits sm_120 and multiplies there on the e4m3 MMA: the
    m16n8k32 e4m3 form in its PTX, QMMA in its SASS. sm_90 has no such instruction: ptxas rewrites it into fp16
    HMMAs (two an MMA), which is why the H200's emulation cannot time this tile as sm_120 runs it."""
    rows = [r for r in fit_report if r["kernel"] == "prefix_latent_split_e4m3"]
    if gluon_shared.unavailable_reason():
        assert not rows
        return
    sm120 = {r["variant"]: r for r in rows if r["target"] == "sm_120"}
    sm90 = [r for r in rows if r["target"] == "sm_90"]
    assert set(sm120) == {"kv=fp8e4nv,v_from_k=True,32x32", "kv=fp8e4nv,v_from_k=True,16x32"} and sm90
    for variant, r in sm120.items():
        assert r["must_fit"] and r["fits"] and r["stack"] == 0 and r["local"] == 0, (variant, r)
        assert "m16n8k32.f32.e4m3.e4m3.f32" in r["mma"], (variant, r["mma"])
        assert any(op.startswith("QMMA.16832.F32.E4M3.E4M3") for op in r["sass_mma"]), (variant, r["sass_mma"])
    for r in sm90:
        assert not any(op.startswith("QMMA") for op in r["sass_mma"]), r["sass_mma"]
        assert any(op.startswith("HMMA") for op in r["sass_mma"]), r["sass_mma"]


def test_dsa_kernels_fit_sm120_and_the_indexer_multiplies_in_e4m3(fit_report):
    """The DSA verify's kernels (sm_120's tiles serve every GPU): compiled for sm_120 within its shared memory, no
    spills, no Hopper-only instructions, and the indexer's fp8 dot on sm_120's e4m3 mma.sync (QMMA in SASS)."""
    dsa = [r for r in fit_report if r["kernel"].startswith("dsa:")]
    kernels = {r["kernel"] for r in dsa}
    assert kernels == {"dsa:indexer", "dsa:topk_histogram", "dsa:topk", "dsa:topk_resolve", "dsa:attention"}, kernels
    assert any(r["variant"].endswith(",n=64") for r in dsa if r["kernel"] == "dsa:topk")  # the prefill's chunk
    for r in dsa:
        assert not r["error"] and r["fits"], r
        if r["target"] == "sm_120":
            assert r["stack"] + r["local"] == 0 and r["hopper_only"] == 0, r
    indexer = [r for r in dsa if r["kernel"] == "dsa:indexer" and r["target"] == "sm_120"]
    assert indexer and all(r["mma"] == ["m16n8k32.f32.e4m3.e4m3.f32"] for r in indexer), indexer
    assert all(any(op.startswith("QMMA") for op in r["sass_mma"]) for r in indexer), indexer


def test_the_dsa_indexer_gathers_keys_four_bytes_at_a_time(fit_report):
    """A key row of the index buffer is 132 bytes (4-byte aligned, never 16): the indexer says so, and its gather on
    sm_120 compiles to 4-byte loads, not to byte loads (its earlier form: 161 byte loads a tile, 128 of them the key
    tile's; now one, the tree's visibility)."""
    indexer = [r for r in fit_report if r["kernel"] == "dsa:indexer" and r["target"] == "sm_120"]
    assert indexer
    for r in indexer:
        loads = r["sass_loads"]
        assert loads.get("LDG.E.U8", 0) < 16 and loads.get("LDG.E", 0) >= 32, loads
