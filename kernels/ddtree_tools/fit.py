"""Compile every shipped kernel configuration offline and check that it fits.

    python -m ddtree_tools.fit            # table
    python -m ddtree_tools.fit --json     # machine-readable, used by the tests

No GPU is needed: Triton compiles for a named target (sm_120, sm_90) and the
cuobjdump bundled with Triton reads registers, stack and local memory from the
cubin. A variant fits when it compiles and its shared memory is within the target's
per-block limit; spills (stack frame, local memory) are reported beside it, and the
tests require none on sm_120. The JIT's
16-byte divisibility hints are passed for the arguments that get them in real
calls, or the shared-memory figure would not be the one the JIT produces.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass

from ddtree_kernels.configs import (
    SHARED_MEMORY_LIMIT,
    SHARED_MEMORY_PER_SM,
    SHIPPED,
    VerifyConfig,
    capabilities_choosing,
)
from ddtree_kernels.hopper import prefix as prefix_hopper
from ddtree_kernels.hopper import prefix_ws as prefix_hopper_ws
from ddtree_kernels.launcher import merge_tile

TARGETS = ((12, 0), (9, 0))

# Argument types per kernel; "constexpr" entries are filled from the variant.
_PREFIX_SIG = dict(
    Q="*bf16", K_buf="*KV", V_buf="*KV", kv_indices="*i64", qo_indptr="*i32", kv_indptr="*i32",
    O_part="*fp32", LSE_part="*fp32", k_scale="fp32", v_scale="fp32", qk_scale_log2="fp32",
    min_chunk="i32", row_base="i32", stride_qt="i32", stride_qh="i32", stride_ks="i32", stride_vs="i32",
    stride_or="i32", stride_op="i32", stride_lr="i32",
)
_TREE_SIG = dict(
    Q="*bf16", K_tree="*bf16", V_tree="*bf16", qo_indptr="*i32", kv_indptr="*i32", mask="*u8",
    mask_indptr="*i64", O_part="*fp32", LSE_part="*fp32", qk_scale_log2="fp32", part="i32",
    mask_row_stride="i32", stride_qt="i32", stride_qh="i32", stride_kt="i32", stride_vt="i32",
    stride_or="i32", stride_op="i32", stride_lr="i32",
)
# prefix_hopper's Gluon kernel (values read from the key rows: no V buffer).
_GLUON_SIG = dict(
    Q="*bf16", K_buf="*KV", kv_indices="*i64", qo_indptr="*i32", kv_indptr="*i32", O_part="*fp32",
    LSE_part="*fp32", k_scale="fp32", v_scale="fp32", qk_scale_log2="fp32", min_chunk="i32", split_reserve="i32",
    late_keys="i32", row_base="i32", row_stride="i32", stride_qt="i32", stride_qh="i32", stride_ks="i32",
    stride_or="i32", stride_op="i32", stride_lr="i32",
)
# Gluon kernels are architecture-specific: prefix_hopper's is compiled for sm_90 only.
_GLUON_TARGETS = {"prefix_gluon": (9, 0), "prefix_gluon_ws": (9, 0)}
_MERGE_SIG = dict(
    O_part="*fp32", LSE_part="*fp32", Out="*bf16", LSE_out="*fp32", qo_indptr="*i32", batch="i32",
    num_parts="i32", stride_or="i32", stride_op="i32", stride_lr="i32", stride_ot="i32",
    stride_oh="i32", stride_lse_t="i32",
)
# Arguments that are multiples of 16 in every real GLM-5 / DeepSeek call (pointers, 576/512 strides).
_ALIGNED = {
    "Q", "K_buf", "V_buf", "kv_indices", "qo_indptr", "kv_indptr", "O_part", "LSE_part", "K_tree",
    "V_tree", "mask", "mask_indptr", "Out", "LSE_out", "stride_qt", "stride_qh", "stride_ks", "stride_vs",
    "stride_kt", "stride_vt", "stride_or", "stride_op", "stride_ot", "stride_oh",
}


@dataclass
class FitResult:
    config: str
    target: str
    kernel: str
    variant: str
    shared: int
    shared_limit: int
    registers: int
    stack: int
    local: int
    must_fit: bool  # the launcher can choose this config on this target
    num_warps: int = 4
    declared_ctas_per_sm: int = 0  # what the config tells the planner (prefix tiles only)
    error: str = ""
    # Grid-dependency instructions in the PTX (programmatic dependent launch): what lets the
    # next kernel launch early, and the waits that keep the tree -> prefix -> merge order.
    launch_dependents: int = 0
    grid_waits: int = 0
    # Instructions sm_120 does not have (wgmma, setmaxnreg, tcgen05/TMEM), counted in the PTX.
    hopper_only: int = 0

    @property
    def fits(self) -> bool:
        """It compiles and its shared memory fits, so it launches. Spills are reported apart:
        sm_120 configs must have none (tests/kernels/test_fit.py); an sm_90-only tile may
        spill a little where it was measured faster anyway (configs.HOPPER)."""
        return not self.error and self.shared <= self.shared_limit

    @property
    def spills(self) -> int:
        return self.stack + self.local

    @property
    def resident_ctas(self) -> int:
        """Programs one SM holds at once, limited by registers and by shared memory."""
        return resident_ctas(self.registers, self.shared, self.num_warps, self.target)


def resident_ctas(registers: int, shared: int, num_warps: int, target: str) -> int:
    """Occupancy in programs per SM: 64K registers allocated per warp in 256-register units,
    and the SM's shared memory with 1 KB the driver reserves for each program."""
    regs_per_warp = -(-max(registers, 1) * 32 // 256) * 256
    by_registers = (65_536 // regs_per_warp) // num_warps
    cap = (int(target[3:-1]), int(target[-1]))
    by_shared = SHARED_MEMORY_PER_SM[cap] // (shared + 1024)
    return min(by_registers, by_shared)


def _variants(conf: VerifyConfig) -> list[tuple[str, str, dict, dict, int, int, int]]:
    """(kernel, variant, signature, constexprs, num_warps, num_stages, ctas_per_sm) for one config."""
    dims = dict(H=8, D_V=512, D_R=64, BLOCK_DV=512, BLOCK_DR=64)
    tc = conf.tree
    out = []
    # (cache dtype, V from K, tile); the row-tail launch compiles to the first variant
    prefixes = [("bf16", True, conf.prefix), ("fp8e4nv", True, conf.prefix_fp8),
                ("fp8e4nv", False, conf.prefix_fp8), ("bf16", False, conf.prefix_split_v)]
    if conf.prefix_wide is not None:
        prefixes.append(("bf16", True, conf.prefix_wide))
    if conf.prefix_wide_fp8 is not None:
        prefixes += [("fp8e4nv", True, conf.prefix_wide_fp8), ("fp8e4nv", False, conf.prefix_wide_fp8)]
    for kv, v_from_k, pc in prefixes:
        sig = {k: (kv if v == "*KV" else v) for k, v in _PREFIX_SIG.items()}
        sig = {k: ("*" + kv if v == kv else v) for k, v in sig.items()}
        const = dict(dims, BLOCK_M=pc.block_m, BLOCK_N=pc.block_n,
                     V_FROM_K=v_from_k, SCALE_FROM_PTR=False, WIDEN_TO_FP16=kv != "bf16", DOT_FP32=False,
                     PREFETCH_L2=True, USE_PDL=True, KEYS_MAJOR=pc.keys_major)
        role = ",wide" if any(pc is w for w in (conf.prefix_wide, conf.prefix_wide_fp8)) else ""
        out.append(("prefix", f"kv={kv},v_from_k={v_from_k}{role}", sig, const, pc.num_warps, pc.num_stages,
                    pc.ctas_per_sm))
    # prefix_hopper's tiles, where the installed Triton builds them (else the launcher never runs them).
    # (kernel, cache dtype, tile, BLOCK_M, TAIL_N, role): a wide tile without and with a row tail in each block
    # (the launcher's fused_tail_rows), a keys-major tile with its rows as wgmma's N (VerifyPlan.gluon_rows).
    gluon_forms = []
    if not prefix_hopper.unavailable_reason():
        gluon_forms += [("prefix_gluon", kv, wide, wide.block_m, tail, f"wide,tail={tail}")
                        for kv, wide in (("bf16", conf.prefix_wide), ("fp8e4nv", conf.prefix_wide_fp8_gluon))
                        if wide is not None and wide.gluon
                        for tail in sorted({0, prefix_hopper.tail_block(conf.gluon_tail_max_rows)})]
        gluon_forms += [("prefix_gluon", kv, tile, 0, n, f"narrow,rows={n}")  # its least and most rows
                        for kv, tile in (("bf16", conf.prefix_narrow_gluon), ("fp8e4nv", conf.prefix_narrow_fp8_gluon))
                        if tile is not None
                        for n in sorted({prefix_hopper.keys_major_block(r) for r in (1, tile.block_m)})]
        # ... and the warp-specialized wide tile (prefix_hopper_ws: scorer, values, row tail), 16-bit caches only.
        if conf.gluon_tail_partition and conf.prefix_wide is not None and conf.prefix_wide.gluon:
            gluon_forms.append(("prefix_gluon_ws", "bf16", conf.prefix_wide, conf.prefix_wide.block_m,
                                prefix_hopper.tail_block(conf.gluon_tail_max_rows), "wide,tail-partition"))
    for kernel, kv, tile, block_m, tail, role in gluon_forms:
        # The warp-specialized kernel launches with its scorer's warps (the launcher's KERNEL_WARPS).
        warps = prefix_hopper_ws.KERNEL_WARPS if kernel == "prefix_gluon_ws" else tile.num_warps
        const = dict(H=8, D_V=512, D_R=64, BLOCK_M=block_m, BLOCK_N=tile.block_n, NUM_STAGES=tile.num_stages,
                     TAIL_N=tail, KV_FP8=kv != "bf16", SCALE_FROM_PTR=False, USE_PDL=True, num_warps=warps)
        sig = {k: ("*" + kv if v == "*KV" else v) for k, v in _GLUON_SIG.items()}
        out.append((kernel, f"kv={kv},v_from_k=True,{role}", sig, const, warps, 1, tile.ctas_per_sm))
    for mode, name in ((1, "sglang_flat"), (0, "chain"), (2, "compact")):
        const = dict(dims, BLOCK_M=tc.block_m, BLOCK_N=tc.block_n, MASK_MODE=mode, DOT_FP32=False, USE_PDL=True)
        out.append(("tree", f"mask={name}", dict(_TREE_SIG), const, tc.num_warps, tc.num_stages, 0))
    for parts in (conf.merge_block_s, conf.max_splits + 1):  # the widest and the tallest merge tile
        block_d, block_s = merge_tile(conf, parts)
        const = dict(H=8, D_V=512, BLOCK_D=block_d, BLOCK_S=block_s, STORE_LSE=True, USE_PDL=True)
        out.append(("merge", f"lse,{block_d}x{block_s}", dict(_MERGE_SIG), const,
                    conf.merge_num_warps, 1, 0))
    return out


def _kernel(name: str):
    from ddtree_kernels.merge import merge_parts_kernel
    from ddtree_kernels.prefix import prefix_split_kernel
    from ddtree_kernels.tree import tree_block_kernel

    if name == "prefix_gluon":
        return prefix_hopper.prefix_wide_hopper_kernel
    if name == "prefix_gluon_ws":
        from ddtree_kernels.hopper.prefix_ws import prefix_wide_ws_kernel

        return prefix_wide_ws_kernel
    return {"prefix": prefix_split_kernel, "tree": tree_block_kernel, "merge": merge_parts_kernel}[name]


def _resource_usage(cubin: bytes) -> tuple[int, int, int]:
    import triton.backends.nvidia as nvidia

    tool = os.path.join(os.path.dirname(nvidia.__file__), "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        cmd = [tool, "--dump-resource-usage", f.name]
        text = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    fields = dict(re.findall(r"\b(REG|STACK|LOCAL):(\d+)", text))
    return int(fields["REG"]), int(fields["STACK"]), int(fields["LOCAL"])


def compile_variant(job: tuple) -> FitResult:
    """Compile one (config, target, kernel variant) and read its resource use."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    config_name, cap, kernel, variant, sig, const, warps, stages, ctas, must_fit = job
    fn = _kernel(kernel)
    limit = SHARED_MEMORY_LIMIT[cap]
    target_name = f"sm_{cap[0]}{cap[1]}"
    full_sig = {name: sig.get(name, "constexpr") for name in fn.arg_names}
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in sig if a in _ALIGNED}
    if kernel in _GLUON_TARGETS:
        from triton.experimental.gluon._runtime import GluonASTSource as ASTSource
    try:
        compiled = triton.compile(
            ASTSource(fn, full_sig, const, attrs),
            target=GPUTarget("cuda", cap[0] * 10 + cap[1], 32),
            options={"num_warps": warps, "num_stages": stages},
        )
        regs, stack, local = _resource_usage(compiled.asm["cubin"])
        ptx = compiled.asm["ptx"]
        return FitResult(config_name, target_name, kernel, variant, compiled.metadata.shared, limit,
                         regs, stack, local, must_fit, compiled.metadata.num_warps, ctas,
                         launch_dependents=ptx.count("griddepcontrol.launch_dependents"),
                         grid_waits=ptx.count("griddepcontrol.wait"),
                         hopper_only=sum(ptx.count(op) for op in ("wgmma.", "setmaxnreg", "tcgen05")))
    except Exception as exc:  # a config that cannot compile must show up, not crash the report
        return FitResult(config_name, target_name, kernel, variant, 0, limit, 0, 0, 0, must_fit, warps, ctas,
                         error=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")


def check_all(workers: int = 2) -> list[FitResult]:
    """Every shipped config x target x kernel variant."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("unset TRITON_INTERPRET: offline compilation needs the real Triton JIT")
    jobs = []
    for name, conf in SHIPPED.items():
        chosen_on = capabilities_choosing(conf)
        for cap in TARGETS:
            for kernel, variant, sig, const, warps, stages, ctas in _variants(conf):
                if _GLUON_TARGETS.get(kernel, cap) != cap:
                    continue
                jobs.append((name, cap, kernel, variant, sig, const, warps, stages, ctas, cap in chosen_on))
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(compile_variant, jobs))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    results = check_all(args.workers)
    if args.json:
        print(json.dumps([asdict(r) | {"fits": r.fits, "resident_ctas": r.resident_ctas} for r in results], indent=1))
    else:
        print(f"{'config':10} {'target':7} {'kernel':7} {'variant':26} {'shared':>8} {'limit':>8} {'regs':>5} "
              f"{'stack':>5} {'local':>5} {'ctas/SM':>7}  verdict")
        for r in results:
            verdict = "ok" if r.fits else ("DOES NOT FIT" if r.must_fit else "not chosen here")
            if r.fits and r.spills:
                verdict += f" (spills {r.spills} B)"
            print(f"{r.config:10} {r.target:7} {r.kernel:7} {r.variant:26} {r.shared:8} {r.shared_limit:8} "
                  f"{r.registers:5} {r.stack:5} {r.local:5} {r.resident_ctas:7}  {verdict} {r.error}")
    return 0 if all(r.fits for r in results if r.must_fit) else 1


if __name__ == "__main__":
    sys.exit(main())
