"""Compile every shipped kernel configuration offline and check that it fits.

    python -m ddtree_tools.fit            # table
    python -m ddtree_tools.fit --json     # machine-readable, used by the tests

What compiles is what runs: for each shipped config and target, the launches (VerifyPlan.launches)
of its plans for a set of verify shapes, with each call-time constexpr variant (the tree's mask
layouts). No GPU is needed: Triton compiles for a named target (sm_120, sm_90) and the
cuobjdump bundled with Triton reads registers, stack and local memory from the
cubin. A variant fits when it compiles and its shared memory is within the target's
per-block limit; spills (stack frame, local memory) are reported beside it, and the
tests require none on sm_120. The JIT's
16-byte divisibility hints are passed for the arguments that get them in real
calls, or the shared-memory figure would not be the one the JIT produces.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ddtree_kernels.configs import (
    SHARED_MEMORY_LIMIT,
    SHARED_MEMORY_PER_SM,
    SHIPPED,
    VerifyConfig,
    capabilities_choosing,
)
from ddtree_kernels.launcher import GLUON_KERNELS, KERNELS, Launch, plan_verify

TARGETS = ((12, 0), (9, 0))

# Argument types of each kernel's runtime arguments; every other argument is a constexpr, taken from the
# launch (VerifyPlan.launches) and the call (launcher.CALL_CONSTEXPRS). "*KV" is the cache's dtype.
_PREFIX_SIG = dict(
    Q="*bf16", K_buf="*KV", V_buf="*KV", kv_indices="*i64", qo_indptr="*i32", kv_indptr="*i32",
    O_part="*fp32", LSE_part="*fp32", k_scale="fp32", v_scale="fp32", qk_scale_log2="fp32",
    min_chunk="i32", row_base="i32", stride_qt="i32", stride_qh="i32", stride_ks="i32", stride_vs="i32",
    stride_or="i32", stride_op="i32", stride_lr="i32",
)
_CHUNKED_SIG = {k: v for k, v in _PREFIX_SIG.items() if k not in ("V_buf", "stride_vs")}
_TREE_SIG = dict(
    Q="*bf16", K_tree="*bf16", V_tree="*bf16", qo_indptr="*i32", kv_indptr="*i32", mask="*u8",
    mask_indptr="*i64", O_part="*fp32", LSE_part="*fp32", qk_scale_log2="fp32", part="i32",
    mask_row_stride="i32", stride_qt="i32", stride_qh="i32", stride_kt="i32", stride_vt="i32",
    stride_or="i32", stride_op="i32", stride_lr="i32",
)
# prefix_hopper's Gluon kernels (values read from the key rows: no V buffer).
_GLUON_SIG = dict(
    Q="*bf16", K_buf="*KV", kv_indices="*i64", qo_indptr="*i32", kv_indptr="*i32", O_part="*fp32",
    LSE_part="*fp32", k_scale="fp32", v_scale="fp32", qk_scale_log2="fp32", min_chunk="i32", split_reserve="i32",
    late_keys="i32", row_base="i32", row_stride="i32", stride_qt="i32", stride_qh="i32", stride_ks="i32",
    stride_or="i32", stride_op="i32", stride_lr="i32",
)
_MERGE_SIG = dict(
    O_part="*fp32", LSE_part="*fp32", Out="*bf16", LSE_out="*fp32", qo_indptr="*i32", batch="i32",
    num_parts="i32", stride_or="i32", stride_op="i32", stride_lr="i32", stride_ot="i32",
    stride_oh="i32", stride_lse_t="i32",
)
# Per launched kernel: (short name in the report, runtime signature, call-time constexpr variants to compile).
_KERNELS = {
    "tree_block_kernel": ("tree", _TREE_SIG, [dict(MASK_MODE=m, DOT_FP32=False) for m in (1, 0, 2)]),
    "prefix_split_kernel": ("prefix", _PREFIX_SIG, [dict(SCALE_FROM_PTR=False, DOT_FP32=False)]),
    "prefix_chunked_kernel": ("prefix_chunked", _CHUNKED_SIG, [dict(SCALE_FROM_PTR=False, DOT_FP32=False)]),
    "prefix_mma_v2_kernel": ("prefix_mma_v2", _CHUNKED_SIG, [dict(SCALE_FROM_PTR=False)]),
    "hopper.prefix.prefix_wide_hopper_kernel": ("prefix_gluon", _GLUON_SIG, [dict(SCALE_FROM_PTR=False)]),
    "hopper.prefix_ws.prefix_wide_ws_kernel": ("prefix_gluon_ws", _GLUON_SIG, [dict(SCALE_FROM_PTR=False)]),
    "merge_parts_kernel": ("merge", _MERGE_SIG, [dict(STORE_LSE=True)]),
}
_MASK_NAMES = {0: "chain", 1: "sglang_flat", 2: "compact"}
# Verify shapes whose plans cover every launch a config makes: (heads, draft tokens) from decode to 33-token
# trees, each on both cache dtypes and both value layouts; the merge also at its most parts (max_splits).
_SHAPES = [(8, 1), (8, 2), (8, 9), (16, 8), (16, 9), (8, 33)]
# A GQA draft model's heads: 6 heads x 16 block tokens, keys and values 128 wide in their own buffers
# (the DFlash drafter DDTree runs beside GLM-5; VerifyConfig.prefix_split_v_narrow_head).
_NARROW_HEAD = dict(heads=6, draft=16, d_v=128, d_rope=0)
# SMs of the GPU each target stands for (grids only; they do not change what compiles).
_TARGET_SMS = {(12, 0): 188, (9, 0): 132}
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
    # The machine code (`cuobjdump -sass`, instructions only): equal digests before and after a refactor
    # mean the GPU runs the same code, so its measurements stand (--sass DIR writes the text).
    sass_sha256: str = ""
    sass: str = field(default="", repr=False)

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


def _variant(launch: Launch, kv: str, v_from_k: bool, call: dict) -> str:
    """A launch's name in the report: its cache, its role, its tile."""
    c = dict(launch.constexprs)
    if launch.kernel.startswith("hopper."):
        if launch.kernel.endswith("ws_kernel"):
            role = "wide,tail-partition"
        else:
            role = f"narrow,rows={c['TAIL_N']}" if c["BLOCK_M"] == 0 else f"wide,tail={c['TAIL_N']}"
        return f"kv={kv},v_from_k=True,{role}"
    if launch.kernel == "tree_block_kernel":
        return f"mask={_MASK_NAMES[call['MASK_MODE']]}"
    if launch.kernel == "merge_parts_kernel":
        return f"lse,{c['BLOCK_D']}x{c['BLOCK_S']}"
    order = ",keys-major" if c.get("KEYS_MAJOR") else ""
    return f"kv={kv},v_from_k={v_from_k},{c['BLOCK_M']}x{c['BLOCK_N']}{order}"


def _jobs(name: str, conf: VerifyConfig, cap: tuple[int, int], must_fit: bool) -> list[tuple]:
    """One compile job for each distinct launch of `conf`'s plans on `cap` (VerifyPlan.launches), and of
    its tiles' fallbacks (what a Triton without the Gluon kernel runs)."""
    plain = conf.with_fallbacks()
    confs = [conf] + ([plain] if plain != conf else [])
    plans = [plan_verify(1, heads, draft, draft, "cpu", config=c, kv_fp8=fp8, v_from_k=v_from_k,
                         gpu=(cap, _TARGET_SMS[cap]))
             for c in confs for heads, draft in _SHAPES for fp8 in (False, True) for v_from_k in (True, False)]
    plans.append(plan_verify(1, 8, 9, 9, "cpu", config=conf, num_splits=conf.max_splits, gpu=(cap, _TARGET_SMS[cap])))
    h = _NARROW_HEAD
    plans += [plan_verify(1, h["heads"], h["draft"], h["draft"], "cpu", config=c, d_v=h["d_v"], d_rope=h["d_rope"],
                          v_from_k=False, gpu=(cap, _TARGET_SMS[cap])) for c in confs]
    jobs, seen = [], set()
    for plan in plans:
        kv = "fp8e4nv" if plan.kv_fp8 else "bf16"
        for launch in plan.launches():
            short, sig, calls = _KERNELS[launch.kernel]
            # The head count only changes index arithmetic: compile every launch at GLM-5's 8.
            const = dict(launch.constexprs) | {"H": 8}
            if launch.kernel in GLUON_KERNELS:
                const["num_warps"] = launch.num_warps  # Gluon kernels lay out for it at trace time
            for call in calls:
                variant = _variant(launch, kv if short.startswith("prefix") else "bf16", plan.v_from_k, call)
                key = (launch.kernel, variant, tuple((const | call).items()), launch.num_warps, launch.num_stages)
                if key in seen:
                    continue
                seen.add(key)
                types = {k: (("*" + kv) if v == "*KV" else v) for k, v in sig.items()}
                jobs.append((name, cap, launch.kernel, variant, types, const | call,
                             launch.num_warps, launch.num_stages, launch.ctas_per_sm, must_fit))
    return jobs


def _cuobjdump(cubin: bytes) -> tuple[int, int, int, str]:
    """(registers, stack, local memory, SASS instructions) of a compiled kernel."""
    import triton.backends.nvidia as nvidia

    tool = os.path.join(os.path.dirname(nvidia.__file__), "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True,
                               check=True).stdout
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    fields = dict(re.findall(r"\b(REG|STACK|LOCAL):(\d+)", usage))
    code = "\n".join(line.strip() for line in sass.splitlines() if re.match(r"\s*/\*[0-9a-f]{4,}\*/", line))
    return int(fields["REG"]), int(fields["STACK"]), int(fields["LOCAL"]), code


def compile_variant(job: tuple) -> FitResult:
    """Compile one (config, target, kernel variant) and read its resource use."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    config_name, cap, kernel, variant, sig, const, warps, stages, ctas, must_fit = job
    fn = KERNELS[kernel]
    short = _KERNELS[kernel][0]
    limit = SHARED_MEMORY_LIMIT[cap]
    target_name = f"sm_{cap[0]}{cap[1]}"
    full_sig = {name: sig.get(name, "constexpr") for name in fn.arg_names}
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in sig if a in _ALIGNED}
    if kernel in GLUON_KERNELS:
        from triton.experimental.gluon._runtime import GluonASTSource as ASTSource
    try:
        compiled = triton.compile(
            ASTSource(fn, full_sig, const, attrs),
            target=GPUTarget("cuda", cap[0] * 10 + cap[1], 32),
            options={"num_warps": warps, "num_stages": stages} if kernel not in GLUON_KERNELS else
            {"num_warps": warps},
        )
        regs, stack, local, sass = _cuobjdump(compiled.asm["cubin"])
        ptx = compiled.asm["ptx"]
        return FitResult(config_name, target_name, short, variant, compiled.metadata.shared, limit,
                         regs, stack, local, must_fit, compiled.metadata.num_warps, ctas,
                         launch_dependents=ptx.count("griddepcontrol.launch_dependents"),
                         grid_waits=ptx.count("griddepcontrol.wait"),
                         hopper_only=sum(ptx.count(op) for op in ("wgmma.", "setmaxnreg", "tcgen05")),
                         sass_sha256=hashlib.sha256(sass.encode()).hexdigest(), sass=sass)
    except Exception as exc:  # a config that cannot compile must show up, not crash the report
        return FitResult(config_name, target_name, short, variant, 0, limit, 0, 0, 0, must_fit, warps, ctas,
                         error=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")


def check_all(workers: int = 2) -> list[FitResult]:
    """Every shipped config x target x kernel variant."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("unset TRITON_INTERPRET: offline compilation needs the real Triton JIT")
    jobs = [job for name, conf in SHIPPED.items() for cap in TARGETS
            for job in _jobs(name, conf, cap, cap in capabilities_choosing(conf))]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(compile_variant, jobs))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--sass", metavar="DIR", type=Path,
                        help="also write each launch's SASS to DIR (diff two such folders to see whether a change "
                             "alters the machine code)")
    args = parser.parse_args(argv)
    results = check_all(args.workers)
    if args.sass:
        args.sass.mkdir(parents=True, exist_ok=True)
        for r in results:
            name = re.sub(r"[^A-Za-z0-9_.=-]+", "_", f"{r.config}-{r.target}-{r.kernel}-{r.variant}")
            (args.sass / f"{name}.sass").write_text(r.sass + "\n")
        print(f"SASS of {len(results)} launches in {args.sass}", file=sys.stderr)
    if args.json:
        print(json.dumps([{k: v for k, v in asdict(r).items() if k != "sass"}
                          | {"fits": r.fits, "resident_ctas": r.resident_ctas} for r in results], indent=1))
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
