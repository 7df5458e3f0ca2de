"""Compile every launch of every rule table offline and check that it fits.

    python -m ddtree_tools.fit            # table
    python -m ddtree_tools.fit --json     # machine-readable, used by the tests

What compiles is what runs: for each rule table and target, the launches (VerifyPlan.launches)
of its plans for a set of verify shapes, with and without the Gluon tiles, with each call-time
constexpr variant (the tree's mask layouts, registry `compile_variants`). No GPU is needed:
Triton compiles for a named target (sm_120, sm_90) and the cuobjdump bundled with Triton reads
registers, stack and local memory from the cubin. A variant fits when it compiles and its shared
memory is within the target's per-block limit; spills (stack frame, local memory) are reported
beside it, and the tests require none on sm_120. The JIT's 16-byte divisibility hints are passed
for the arguments that get them in real calls (registry.ALIGNED_ARGS), or the shared-memory
figure would not be the one the JIT produces.
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
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ddtree_kernels.dsa.launcher import DSA_KERNELS, plan_dsa_verify
from ddtree_kernels.dsa.prefill import CHUNK as PREFILL_CHUNK
from ddtree_kernels.gluon_shared import unavailable_reason
from ddtree_kernels.launcher import plan_verify
from ddtree_kernels.plan_types import Launch, RuleTable
from ddtree_kernels.registry import ALIGNED_ARGS, ARG_TYPES, KERNELS
from ddtree_kernels.selection import TABLES, capabilities_choosing
from ddtree_kernels.sm120.rules import SM120_E4M3
from ddtree_kernels.target import NAMED, SHARED_MEMORY_LIMIT, SHARED_MEMORY_PER_SM, Target

TARGETS = ((12, 0), (9, 0))

_MASK_NAMES = {0: "chain", 1: "sglang_flat", 2: "compact"}
# The DSA kernels' arguments that are multiples of 16 in real calls: pointers and the 576-wide rows' strides (an
# index-key row is 132 bytes, so its strides get no hint).
DSA_ALIGNED_ARGS = frozenset({
    "IQ", "IW", "index_k", "index_s", "kv_indices", "kv_indptr", "qo_indptr", "tree_slots", "vis", "Logits", "State",
    "Sel", "SelCount", "CandKey", "CandSlot", "Q", "K_buf", "O_part", "LSE_part", "stride_qt", "stride_qh", "stride_ks",
    "stride_iqt", "stride_iqh", "stride_iwt",  # GLM-5's index queries [T, 32, 128] and gates [T, 32]
})
# Verify shapes whose plans cover every launch a table makes: (heads, draft tokens) from decode to 33-token
# trees, each on both cache dtypes and both value layouts; the merge also at its most parts (max_splits).
_SHAPES = [(8, 1), (8, 2), (8, 9), (16, 8), (16, 9), (8, 33)]
# A GQA draft model's heads: 6 heads x 16 block tokens, keys and values 128 wide in their own buffers
# (the DFlash drafter DDTree runs beside GLM-5; sm120/rules.py rule 13).
_NARROW_HEAD = dict(heads=6, draft=16, d_v=128, d_rope=0)


@dataclass
class FitResult:
    table: str
    target: str
    kernel: str
    variant: str
    shared: int
    shared_limit: int
    registers: int
    stack: int
    local: int
    must_fit: bool  # a target of this capability plans with this table
    num_warps: int = 4
    declared_programs_per_sm: int = 0  # what the table tells the planner (prefix tiles only)
    error: str = ""
    # Grid-dependency instructions in the PTX (programmatic dependent launch): what lets the
    # next kernel launch early, and the waits that keep the tree -> prefix -> merge order.
    launch_dependents: int = 0
    grid_waits: int = 0
    # Instructions sm_120 does not have (wgmma, setmaxnreg, tcgen05/TMEM), counted in the PTX.
    hopper_only: int = 0
    # The distinct mma.sync forms in the PTX (shape and types, e.g. "m16n8k16.f32.bf16.bf16.f32"): which tensor-core
    # instruction a launch multiplies with, on the target it was compiled for.
    mma: list[str] = field(default_factory=list)
    # The tensor-core instructions in the SASS and their counts (HMMA.16816..., QMMA.16832...): what the GPU runs
    # for them (on sm_90 ptxas rewrites an e4m3 mma.sync into fp16 HMMAs).
    sass_mma: dict[str, int] = field(default_factory=dict)
    # The global-memory load forms in the SASS and their counts: how wide a gather reads (LDG.E.U8 is a byte).
    sass_loads: dict[str, int] = field(default_factory=dict)
    # The machine code (`cuobjdump -sass`, instructions only): equal digests before and after a refactor
    # mean the GPU runs the same code, so its measurements stand (--sass DIR writes the text).
    sass_sha256: str = ""
    sass: str = field(default="", repr=False)

    @property
    def fits(self) -> bool:
        """It compiles and its shared memory fits, so it launches. Spills are reported apart:
        sm_120's launches must have none (tests/kernels/test_fit.py); an sm_90-only tile may
        spill a little where it was measured faster anyway (hopper/rules.py)."""
        return not self.error and self.shared <= self.shared_limit

    @property
    def spills(self) -> int:
        return self.stack + self.local

    @property
    def resident_programs(self) -> int:
        """Programs one SM holds at once, limited by registers and by shared memory."""
        return resident_programs(self.registers, self.shared, self.num_warps, self.target)


def resident_programs(registers: int, shared: int, num_warps: int, target: str) -> int:
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
    if launch.kernel.startswith("hopper_"):
        if launch.kernel.endswith("_ws"):
            role = "wide,tail-partition"
        else:
            role = f"narrow,rows={c['TAIL_N']}" if c["BLOCK_M"] == 0 else f"wide,tail={c['TAIL_N']}"
        return f"kv={kv},v_from_k=True,{role}"
    if launch.kernel == "tree":
        return f"mask={_MASK_NAMES[call['MASK_MODE']]}"
    if launch.kernel == "merge":
        return f"lse,{c['BLOCK_D']}x{c['BLOCK_S']}"
    order = ",keys-major" if c.get("KEYS_MAJOR") else ""
    return f"kv={kv},v_from_k={v_from_k},{c['BLOCK_M']}x{c['BLOCK_N']}{order}"


def _targets(cap: tuple[int, int]) -> list[Target]:
    """The target of this capability with a Triton that builds the Gluon tiles (where this one does) and
    without: what each rule table runs in either case."""
    name = next(n for n, (c, _) in NAMED.items() if c == cap)
    return [Target.named(name, gluon=g) for g in ((False,) if unavailable_reason() else (True, False))]


def _jobs(name: str, table: RuleTable, cap: tuple[int, int], must_fit: bool) -> list[tuple]:
    """One compile job for each distinct launch of `table`'s plans on `cap` (VerifyPlan.launches), with and
    without the Gluon tiles (what a Triton outside their tested range runs)."""
    plans = [plan_verify(1, heads, draft, draft, target, table=table, kv_fp8=fp8, v_from_k=v_from_k)
             for target in _targets(cap) for heads, draft in _SHAPES for fp8 in (False, True)
             for v_from_k in (True, False)]
    plans.append(plan_verify(1, 8, 9, 9, _targets(cap)[0], table=table, num_splits=table.max_splits))
    h = _NARROW_HEAD
    plans += [plan_verify(1, h["heads"], h["draft"], h["draft"], target, table=table, d_v=h["d_v"], d_rope=h["d_rope"],
                          v_from_k=False) for target in _targets(cap)]
    jobs, seen = [], set()
    for plan in plans:
        kv = "fp8e4nv" if plan.kv_fp8 else "bf16"
        for launch in plan.launches():
            entry = KERNELS[launch.kernel]
            # The head count only changes index arithmetic: compile every launch at GLM-5's 8.
            const = dict(launch.constexprs) | {"H": 8}
            if entry.gluon:
                const["num_warps"] = launch.num_warps  # Gluon kernels lay out for it at trace time
            for call in map(dict, entry.compile_variants):
                variant = _variant(launch, kv if entry.label.startswith("prefix") else "bf16", plan.v_from_k, call)
                key = (launch.kernel, variant, tuple((const | call).items()), launch.num_warps, launch.num_stages)
                if key in seen:
                    continue
                seen.add(key)
                types = {k: (("*" + kv) if ARG_TYPES[k] == "*KV" else ARG_TYPES[k]) for k in entry.runtime}
                jobs.append((name, cap, launch.kernel, variant, types, const | call,
                             launch.num_warps, launch.num_stages, launch.programs_per_sm, must_fit))
    return jobs


def mma_forms(ptx: str) -> list[str]:
    """The distinct `mma.sync.aligned` forms in PTX, without the layout qualifiers (row.col)."""
    forms = re.findall(r"mma\.sync\.aligned\.(m\d+n\d+k\d+)(?:\.row\.col)?((?:\.[a-z0-9]+)+)", ptx)
    return sorted({shape + types for shape, types in forms})


def sass_mma(sass: str) -> dict[str, int]:
    """Count of each tensor-core instruction in SASS (HMMA.16816.F32..., QMMA.16832.F32.E4M3.E4M3...)."""
    return dict(Counter(re.findall(r"\b([HQ]MMA\.[0-9A-Z.]+)", sass)))


def sass_loads(sass: str) -> dict[str, int]:
    """Count of each global-memory load form in SASS: LDG.E.U8 (a byte), LDG.E.128 (16 bytes), LDGSTS.E (an
    asynchronous 4-byte copy to shared memory)..."""
    return dict(Counter(re.findall(r"\b(LDGSTS\.[0-9A-Z.]+|LDG\.[0-9A-Z.]+)", sass)))


def cuobjdump(cubin: bytes) -> tuple[int, int, int, str]:
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


def _dsa_jobs(cap: tuple[int, int]) -> list[tuple]:
    """The DSA verify's kernels (ddtree_kernels.dsa, DSA_KERNELS) as its plans launch them on `cap`: GLM-5's tree
    and decode, a bf16 and an fp8 cache, the top-k's histogram, collect and resolve, and the prefill's chunk (its
    collect and resolve walk a longer chain; the other kernels' constexprs do not depend on it). A kernel whose
    constexprs repeat an earlier job's is compiled once. sm_120's DSA tiles serve every GPU, so all must fit."""
    target = _targets(cap)[-1]
    jobs, seen = [], set()
    for draft, fp8 in ((9, False), (9, True), (1, False), (PREFILL_CHUNK, False)):
        plan = plan_dsa_verify(1, 8, draft, draft, 185_000, target, kv_fp8=fp8)
        kv = "fp8e4nv" if fp8 else "bf16"
        for kernel, (_, types) in DSA_KERNELS.items():
            if (fp8 and kernel != "attention") or (draft == PREFILL_CHUNK and not kernel.startswith("topk")):
                continue
            const = plan.constexprs(kernel, interpreted=False)
            warps, stages = const.pop("num_warps"), const.pop("num_stages")
            sig = {k: ("*" + kv if v == "*KV" else v) for k, v in types.items()}
            calls = [{"SCALE_FROM_PTR": False}] if kernel == "attention" else [{}]
            for call in calls:
                key = (kernel, repr(sorted(sig.items())), repr(sorted((const | call).items())), warps, stages)
                if key in seen:
                    continue
                seen.add(key)
                variant = f"kv={kv},n={draft}" + "".join(f",{k}={v}" for k, v in call.items())
                jobs.append((plan.tiles.name, cap, f"dsa:{kernel}", variant, sig, const | call, warps, stages, 0,
                             True))
    return jobs


def compile_variant(job: tuple) -> FitResult:
    """Compile one (table, target, kernel variant) and read its resource use."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    table_name, cap, kernel, variant, sig, const, warps, stages, programs, must_fit = job
    if kernel.startswith("dsa:"):
        fn, short, gluon, aligned = DSA_KERNELS[kernel[4:]][0], kernel, False, DSA_ALIGNED_ARGS
    else:
        entry = KERNELS[kernel]
        fn, short, gluon, aligned = entry.fn, entry.label, entry.gluon, ALIGNED_ARGS
    limit = SHARED_MEMORY_LIMIT[cap]
    target_name = f"sm_{cap[0]}{cap[1]}"
    full_sig = {name: sig.get(name, "constexpr") for name in fn.arg_names}
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in sig if a in aligned}
    if gluon:
        from triton.experimental.gluon._runtime import GluonASTSource as ASTSource
    try:
        compiled = triton.compile(
            ASTSource(fn, full_sig, const, attrs),
            target=GPUTarget("cuda", cap[0] * 10 + cap[1], 32),
            options={"num_warps": warps, "num_stages": stages} if not gluon else
            {"num_warps": warps},
        )
        regs, stack, local, sass = cuobjdump(compiled.asm["cubin"])
        ptx = compiled.asm["ptx"]
        return FitResult(table_name, target_name, short, variant, compiled.metadata.shared, limit,
                         regs, stack, local, must_fit, compiled.metadata.num_warps, programs,
                         launch_dependents=ptx.count("griddepcontrol.launch_dependents"),
                         grid_waits=ptx.count("griddepcontrol.wait"),
                         hopper_only=sum(ptx.count(op) for op in ("wgmma.", "setmaxnreg", "tcgen05")),
                         mma=mma_forms(ptx), sass_mma=sass_mma(sass), sass_loads=sass_loads(sass),
                         sass_sha256=hashlib.sha256(sass.encode()).hexdigest(), sass=sass)
    except Exception as exc:  # a launch that cannot compile must show up, not crash the report
        return FitResult(table_name, target_name, short, variant, 0, limit, 0, 0, 0, must_fit, warps, programs,
                         error=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")


def check_all(workers: int = 2) -> list[FitResult]:
    """Every rule table x target x kernel variant."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("unset TRITON_INTERPRET: offline compilation needs the real Triton JIT")
    jobs = [job for name, table in TABLES.items() for cap in TARGETS
            for job in _jobs(name, table, cap, cap in capabilities_choosing(table))]
    # The opt-in e4m3 tile, which must fit the GPU it is for (only its own launches: the rest are sm120's).
    jobs += [job for cap in TARGETS for job in _jobs(SM120_E4M3.name, SM120_E4M3, cap, cap == (12, 0))
             if job[2] == "prefix_latent_split_e4m3"]
    jobs += [job for cap in TARGETS for job in _dsa_jobs(cap)]
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
            name = re.sub(r"[^A-Za-z0-9_.=-]+", "_", f"{r.table}-{r.target}-{r.kernel}-{r.variant}")
            (args.sass / f"{name}.sass").write_text(r.sass + "\n")
        print(f"SASS of {len(results)} launches in {args.sass}", file=sys.stderr)
    if args.json:
        print(json.dumps([{k: v for k, v in asdict(r).items() if k != "sass"}
                          | {"fits": r.fits, "resident_programs": r.resident_programs} for r in results], indent=1))
    else:
        print(f"{'table':10} {'target':7} {'kernel':7} {'variant':26} {'shared':>8} {'limit':>8} {'regs':>5} "
              f"{'stack':>5} {'local':>5} {'per SM':>7}  verdict")
        for r in results:
            verdict = "ok" if r.fits else ("DOES NOT FIT" if r.must_fit else "not chosen here")
            if r.fits and r.spills:
                verdict += f" (spills {r.spills} B)"
            print(f"{r.table:10} {r.target:7} {r.kernel:7} {r.variant:26} {r.shared:8} {r.shared_limit:8} "
                  f"{r.registers:5} {r.stack:5} {r.local:5} {r.resident_programs:7}  {verdict} {r.error}")
    return 0 if all(r.fits for r in results if r.must_fit) else 1


if __name__ == "__main__":
    sys.exit(main())
