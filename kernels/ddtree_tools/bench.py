"""Side-by-side benchmark of tree-verify attention on one GPU (DESIGN.md §2, benchmark rules).

    python -m ddtree_tools.bench --sglang-wheel sglang-0.5.23-...whl --out results/
    make bench-kernels SGLANG_WHEEL=...                       # the same
    python -m ddtree_tools.bench --emulate sm120 --table sm120-e4m3 --case 1,185000,8,9,fp8 --out DIR

One run measures the copy and bf16-matmul ceilings, then per case: this kernel (eager
and inside a replayed CUDA graph), SGLang's extend_attention_fwd with the same tree mask
(the path DDTree uses today), SGLang's chain-only verify_shared_kv_fwd where it runs,
and a torch gather + matmul. Random data, random slots (page_size 1), several KV pools
rotated so L2 (50 MB on an H200) never holds the working set, medians of device-event
timings after warm-up (`triton.testing.do_bench`, with its L2 flush done by a read: `_time`).
Every case also checks our output against SGLang's and against the float64 reference.
Writes bench.json, bench.md and bench.png.

`--emulate sm120` measures the path the RTX PRO 6000 runs, on the GPU at hand: every plan is made
for `Target.emulating("sm120", device)` (its rule table, tiles and programs an SM; grids sized for this
GPU's SMs), DISABLE_MMA_V3=1 makes Triton lower every dot to mma.sync as on sm_120 (checked in the
compiled PTX: the run stops if a wgmma appears), and the floor's compute ceiling is a Triton bf16
GEMM under the same setting. Each case then gets a labelled projection to the RTX PRO 6000 (model:
`projection`). Every kernel loaded after the ceilings runs with sm_120's 100 KB of shared memory an
SM (the driver's carveout, `cap_shared_memory`), so no more programs share an SM than fit there. What
emulation cannot show: sm_120 has 3.4x less DRAM bandwidth per SM than the H200, 2.5x its L2 (128 MB).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import triton
import triton.language as tl

from ddtree_kernels import masks, reference
from ddtree_kernels.launcher import Workspace, plan_verify, run_verify
from ddtree_kernels.plan_types import RuleTable
from ddtree_kernels.selection import TABLES
from ddtree_kernels.sm120.rules import SM120_E4M3
from ddtree_kernels.target import SHARED_MEMORY_PER_SM, Target
from ddtree_kernels.tree import MASK_COMPACT

D_QK, D_V = 576, 512
EMULATIONS = {"sm120": (12, 0)}
BENCH_TABLES = {**TABLES, SM120_E4M3.name: SM120_E4M3}  # --table
# RTX PRO 6000 Blackwell (sm_120): DRAM bandwidth and published cuBLASLt mma.sync throughput.
RTX_PRO_6000 = {"gbs": 1792.0, "bf16_tflops": 458.0, "fp8_tflops": 905.0}


@dataclass(frozen=True)
class Case:
    bs: int
    L: int
    H: int
    n: int
    fp8: bool = False
    slots: str = "scattered"  # or "contiguous"

    @property
    def label(self) -> str:
        extra = (" fp8" if self.fp8 else "") + (" contiguous" if self.slots != "scattered" else "")
        return f"bs{self.bs} L{self.L} H{self.H} n{self.n}{extra}"

    def kv_bytes(self) -> int:
        return self.bs * self.L * D_QK * (1 if self.fp8 else 2)

    def flops(self) -> int:
        return 2 * self.bs * self.n * self.H * self.L * (D_QK + D_V)


FULL = [
    *(Case(1, L, 8, 9) for L in (8192, 32768, 65536, 131072, 185000)),
    Case(1, 185000, 8, 9, slots="contiguous"),
    Case(1, 65536, 8, 9, slots="contiguous"),
    *(Case(1, L, 16, 9) for L in (8192, 65536, 185000)),
    Case(1, 185000, 8, 33),
    Case(1, 65536, 16, 33),
    Case(1, 185000, 16, 33),
    Case(1, 185000, 8, 3),  # 24 rows: the Gluon wide tile as one masked block
    Case(1, 65536, 8, 17),
    Case(1, 65536, 8, 65),
    Case(4, 65536, 8, 9),
    Case(4, 185000, 16, 9),
    Case(8, 32768, 16, 9),
    Case(8, 65536, 8, 9),
    Case(1, 65536, 64, 9),
    Case(1, 185000, 8, 9, fp8=True),
    Case(1, 65536, 16, 9, fp8=True),
    Case(1, 185000, 8, 3, fp8=True),
    Case(1, 185000, 8, 1),
    Case(1, 185000, 8, 1, fp8=True),
    Case(4, 185000, 8, 1),
]
QUICK = [Case(1, 8192, 8, 9), Case(1, 65536, 8, 9), Case(1, 185000, 8, 1)]


@dataclass
class Row:
    case: dict
    floor_us: float
    ours_us: float = math.nan
    ours_graph_us: float = math.nan
    sglang_extend_us: float = math.nan
    sglang_chain_us: float = math.nan
    torch_us: float = math.nan
    err_vs_sglang: float = math.nan
    err_vs_reference: float = math.nan
    projected_us: float = math.nan  # emulation only: the RTX PRO 6000 projection (bench.projection)
    notes: list[str] = field(default_factory=list)


def ceilings(device: str) -> tuple[float, float]:
    """(copy GB/s counting read + write, bf16 matmul TFLOP/s), measured now."""
    x = torch.empty(1 << 30, dtype=torch.bfloat16, device=device)
    y = torch.empty_like(x)
    t = _time(lambda: y.copy_(x), rep_ms=300, warmup_ms=50)
    copy = 2 * x.numel() * 2 / t / 1e3
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=device)
    b = torch.randn_like(a)
    t = _time(lambda: a @ b, rep_ms=300, warmup_ms=50)
    return copy, 2 * 8192**3 / t / 1e6


@triton.jit
def _gemm_kernel(A, B, C, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """C = A @ B (row-major, sizes multiples of the blocks): the mma ceiling of Triton's own code."""
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        a = tl.load(A + rm[:, None] * K + (k + rk)[None, :])
        b = tl.load(B + (k + rk)[:, None] * N + rn[None, :])
        acc = tl.dot(a, b, acc)
    tl.store(C + rm[:, None] * N + rn[None, :], acc.to(C.dtype.element_ty))


GEMM_TILES = [(128, 128, 64, 4, 3), (128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (128, 128, 32, 4, 4)]


def triton_gemm_ceiling(dtype: torch.dtype, device: str, size: int = 8192) -> tuple[float, str]:
    """(best TFLOP/s of _gemm_kernel over GEMM_TILES, the MMA instruction its PTX uses) on size^3."""
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    c = torch.empty(size, size, dtype=torch.bfloat16, device=device)
    best, instruction = 0.0, ""
    for bm, bn, bk, warps, stages in GEMM_TILES:
        grid = (size // bm, size // bn)

        def run(bm=bm, bn=bn, bk=bk, warps=warps, stages=stages, grid=grid):
            return _gemm_kernel[grid](a, b, c, size, size, size, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                                      num_warps=warps, num_stages=stages)

        try:
            compiled = run()
            t = _time(run, rep_ms=200, warmup_ms=25)
        except Exception:  # a tile that does not fit this GPU's shared memory
            continue
        if 2 * size**3 / t / 1e6 > best:
            best = 2 * size**3 / t / 1e6
            ptx = compiled.asm["ptx"]
            instruction = next((line.split()[0] for line in ptx.splitlines()
                                if line.strip().startswith(("wgmma.mma_async", "mma.sync"))), "none")
    return best, instruction


def enable_emulation(name: str, device: str) -> dict:
    """Dots on mma.sync and the emulated GPU's shared memory an SM; refuses to go on if Triton still emits wgmma.
    Plans for the emulated GPU take `Target.emulating(name, device)`."""
    if name not in EMULATIONS:
        raise SystemExit(f"--emulate {name}: choose one of {', '.join(EMULATIONS)}")
    os.environ["DISABLE_MMA_V3"] = "1"  # read by Triton at each compile (and part of its cache key)
    bf16, bf16_mma = triton_gemm_ceiling(torch.bfloat16, device)
    if not bf16_mma.startswith("mma.sync"):
        raise SystemExit(f"sm_120 emulation needs mma.sync, but Triton emitted {bf16_mma!r} with DISABLE_MMA_V3=1: "
                         "set it in the environment before Python starts and clear ~/.triton/cache")
    fp8, fp8_mma, fp8_sass = e4m3_gemm_ceiling(device)
    shared = cap_shared_memory(SHARED_MEMORY_PER_SM[EMULATIONS[name]], device)
    return {"emulate": name, "mma_tflops": bf16, "mma_instruction": bf16_mma, "fp8_mma_tflops": fp8,
            "fp8_mma_instruction": fp8_mma, "fp8_mma_sass": fp8_sass, "shared_memory_per_sm": shared}


def e4m3_gemm_ceiling(device: str, size: int = 8192) -> tuple[float, str, str]:
    """(TFLOP/s, PTX form, SASS tensor-core instructions) of the e4m3 mma.sync GEMM (mma_gemm.py) on size^3.
    The SASS says whether this GPU runs the instruction (QMMA) or ptxas rewrote it into fp16 MMAs (sm_90)."""
    from .fit import cuobjdump, mma_forms, sass_mma
    from .mma_gemm import mma_gemm

    a = torch.randn(size, size, device=device).to(torch.float8_e4m3fn)
    b = torch.randn(size, size, device=device).to(torch.float8_e4m3fn)
    _, compiled = mma_gemm(a, b)
    t = _time(lambda: mma_gemm(a, b), rep_ms=200, warmup_ms=25)
    sass = ", ".join(f"{n} {op}" for op, n in sorted(sass_mma(cuobjdump(compiled.asm["cubin"])[3]).items()))
    return 2 * size**3 / t / 1e6, " ".join(mma_forms(compiled.asm["ptx"])), sass


_CARVEOUT = 9  # CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT


def cap_shared_memory(per_sm: int, device: str) -> int:
    """From now on every kernel Triton loads prefers a shared-memory carveout of at most `per_sm` bytes an
    SM (the driver takes the smallest supported size that holds it: 100 KB on an H200 for sm_120's
    102,400), so an SM holds no more of its programs than the emulated GPU would. Returns the bytes asked."""
    total = torch.cuda.get_device_properties(device).shared_memory_per_multiprocessor
    percent = per_sm * 100 // total
    libcuda = ctypes.CDLL("libcuda.so.1")

    def carveout(module, function, *_) -> None:
        err = libcuda.cuFuncSetAttribute(ctypes.c_void_p(function), _CARVEOUT, ctypes.c_int(percent))
        if err:
            raise RuntimeError(f"cuFuncSetAttribute(shared-memory carveout {percent}%) failed: CUresult {err}")

    triton.knobs.runtime.kernel_load_end_hook.add(carveout)
    return per_sm


def projection(case: Case, measured_us: float, mma_tflops: float) -> float:
    """µs on an RTX PRO 6000 (a projection, not a measurement): max(bytes / its bandwidth, flops / (its
    bf16 mma.sync rate x the fraction of this GPU's mma.sync ceiling the kernel reached here))."""
    reached = case.flops() / measured_us / 1e6 / mma_tflops
    return max(case.kv_bytes() / RTX_PRO_6000["gbs"] / 1e3,
               case.flops() / (RTX_PRO_6000["bf16_tflops"] * reached) / 1e6)


class Problem:
    """One case's inputs: shared queries and tree, several KV pools to rotate through."""

    def __init__(self, case: Case, device: str, l2_bytes: int = 50 << 20):
        self.case = case
        bs, L, H, n = case.bs, case.L, case.H, case.n
        T, S = bs * n, bs * L + 4096
        self.qo = (torch.arange(bs + 1, dtype=torch.int32) * n).to(device)
        self.kv = (torch.arange(bs + 1, dtype=torch.int32) * L).to(device)
        pool_bytes = S * D_QK * (1 if case.fp8 else 2)
        self.pools = []
        for _ in range(max(2, min(8, math.ceil(4 * l2_bytes / pool_bytes)))):
            k = torch.randn(S, 1, D_QK, device=device)
            k = (k / 0.5).to(torch.float8_e4m3fn) if case.fp8 else k.to(torch.bfloat16)
            idx = (
                torch.randperm(S, device=device)[: bs * L]
                if case.slots == "scattered"
                else torch.arange(bs * L, device=device) + 64
            )
            self.pools.append((k, idx))
        self.k_scale = 0.5 if case.fp8 else 1.0
        self.q = torch.randn(T, H, D_QK, device=device, dtype=torch.bfloat16)
        self.k_tree = torch.randn(T, 1, D_QK, device=device, dtype=torch.bfloat16)
        self.v_tree = torch.randn(T, 1, D_V, device=device, dtype=torch.bfloat16)
        self.vis = masks.parents_to_visibility(masks.random_parents([n] * bs), self.qo.cpu(), n).to(device)
        flat, self.mask_indptr = masks.visibility_to_sglang_flat(self.vis, self.qo, self.kv)
        self.flat_mask = flat
        self.turn = 0

    def next_pool(self):
        self.turn += 1
        return self.pools[self.turn % len(self.pools)]

    def run_ours(self, plan, ws: Workspace, out: torch.Tensor, pool) -> None:
        """One call of our kernels on `pool` (compact tree mask)."""
        k, idx = pool
        run_verify(plan, ws, self.q, k, k[..., :D_V], self.kv, idx, self.k_tree, self.v_tree, self.qo, out,
                   mask_mode=MASK_COMPACT, mask=self.vis.view(torch.uint8), mask_indptr=None,
                   mask_row_stride=self.case.n, sm_scale=1 / 16, k_scale=self.k_scale, v_scale=self.k_scale)

    def sglang_args(self, pool, out, tree: bool = True) -> tuple:
        k, idx = pool
        return (
            self.q,
            self.k_tree,
            self.v_tree,
            out,
            k,
            k[..., :D_V],
            self.qo,
            self.kv,
            idx,
            self.flat_mask if tree else None,
            True,
            self.mask_indptr if tree else None,
            self.case.n,
            self.k_scale,
            self.k_scale,
            1 / 16,
        )


@contextmanager
def _read_flush():
    """Make do_bench flush L2 by reading its 256 MB buffer instead of zeroing it.

    Zeroing leaves L2 full of dirty lines (~50 MB on an H200) that the timed call then pays to
    write back: +6.6 µs on a 72 µs decode call, nothing on a ms-long one (measured on the H200).
    After a read, L2 holds nothing of the timed call's and nothing dirty, which is
    what it holds in a model's forward pass, where the layers before attention mostly read weights.
    """
    driver = triton.runtime.driver.active
    own = vars(driver).get("clear_cache")  # None: the class's method
    sink = torch.empty((), dtype=torch.int64, device="cuda")
    driver.clear_cache = lambda cache: torch.sum(cache, dim=0, out=sink)
    try:
        yield
    finally:
        if own is None:
            del driver.clear_cache
        else:
            driver.clear_cache = own


def _time(fn, rep_ms: int = 200, warmup_ms: int = 25) -> float:
    """Median µs of `fn`, device events (do_bench), L2 flushed by a read before every run."""
    with _read_flush():
        return triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median") * 1e3


def time_in_graphs(calls: list) -> float:
    """Median µs of one call replayed from a CUDA graph, one graph per call, replays rotated (L2 defeated)."""
    graphs = []
    for call in calls:
        call()  # compile and warm up outside capture
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            call()
        graphs.append(g)
    turn = iter(range(1 << 62))
    return _time(lambda: graphs[next(turn) % len(graphs)].replay())


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def measure(case: Case, device: str, copy: float, mm: float, sgl: dict | None, target: Target | None = None,
            table: RuleTable | None = None) -> Row:
    """One case: our call eagerly and in graphs, SGLang's, the errors. `target`: the GPU to plan for (emulation);
    `table`: the rule table to plan with (default: the target's)."""
    p = Problem(case, device)
    row = Row(case=asdict(case), floor_us=max(case.kv_bytes() / copy / 1e3, case.flops() / mm / 1e6))
    T = case.bs * case.n
    out = torch.empty(T, case.H, D_V, dtype=torch.bfloat16, device=device)
    plan = plan_verify(case.bs, case.H, case.n, T, target or Target.detect(device), kv_fp8=case.fp8, table=table)
    ws = Workspace.for_plan(plan, device)

    def ours(pool=None):
        p.run_ours(plan, ws, out, pool or p.next_pool())

    ours(p.pools[0])
    torch.cuda.synchronize()
    row.ours_us = _time(ours)
    row.ours_graph_us = time_in_graphs([lambda pool=pool: ours(pool) for pool in p.pools])

    ours(p.pools[0])
    ref_pool = p.pools[0]
    if case.bs * case.L <= 400_000:
        ref, _ = reference.tree_verify_reference(
            p.q,
            ref_pool[0],
            ref_pool[0][..., :D_V],
            p.kv,
            ref_pool[1],
            p.k_tree,
            p.v_tree,
            p.qo,
            p.vis,
            1 / 16,
            p.k_scale,
            p.k_scale,
            d_v=D_V,
        )
        row.err_vs_reference = _rel(out.cpu(), ref)
    if sgl is not None:
        theirs = torch.empty_like(out)
        sgl["extend_attention"].extend_attention_fwd(*p.sglang_args(ref_pool, theirs))
        row.err_vs_sglang = _rel(out, theirs)
        row.sglang_extend_us = _time(
            lambda: sgl["extend_attention"].extend_attention_fwd(*p.sglang_args(p.next_pool(), theirs)), rep_ms=100
        )
        chain = sgl.get("verify_mla")
        if chain is not None:
            try:
                if chain.verify_shared_kv_fwd(*p.sglang_args(ref_pool, theirs, tree=False), max_bs=case.bs):
                    row.sglang_chain_us = _time(
                        lambda: chain.verify_shared_kv_fwd(
                            *p.sglang_args(p.next_pool(), theirs, tree=False), max_bs=case.bs
                        )
                    )
                else:
                    row.notes.append("chain split-KV declined")
            except Exception as exc:  # e.g. out of shared memory at n = 33
                row.notes.append(f"chain split-KV: {type(exc).__name__}: {str(exc)[:60]}")
    if case.bs == 1 and not case.fp8:
        row.torch_us = _time(lambda: _torch_gather_matmul(p, p.next_pool()), rep_ms=100)
    return row  # the pools are freed with `p` here; the caller empties the cache


def _torch_gather_matmul(p: Problem, pool) -> torch.Tensor:
    """The plain-torch way: gather the prefix, one masked softmax over prefix + tree."""
    k, idx = pool
    keys = torch.cat([k[idx, 0], p.k_tree[:, 0]])  # [L + n, 576]
    scores = torch.einsum("thd,kd->thk", p.q, keys).float() * (1 / 16)
    L = idx.numel()
    scores[:, :, L:] = scores[:, :, L:].masked_fill(~p.vis[:, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(torch.bfloat16)
    return torch.einsum("thk,kd->thd", probs, torch.cat([k[idx, 0, :D_V], p.v_tree[:, 0]]))


def derived(row: Row) -> dict:
    c = Case(**row.case)
    t = row.ours_graph_us
    return dict(
        gbs=c.kv_bytes() / t / 1e3,
        tflops=c.flops() / t / 1e6,
        efficiency=row.floor_us / t,
        speedup_vs_sglang=row.sglang_extend_us / t,
    )


def markdown(rows: list[Row], meta: dict) -> str:
    emulated = meta.get("emulate")
    ceiling = (f"mma.sync ceiling (Triton bf16 GEMM, {meta['mma_instruction']}) {meta['mma_tflops']:.0f} TFLOP/s; "
               f"e4m3 mma.sync GEMM {meta['fp8_mma_tflops']:.0f} TFLOP/s (PTX {meta['fp8_mma_instruction']}; "
               f"SASS {meta.get('fp8_mma_sass', '?')})"
               if emulated else f"bf16 matmul {meta['matmul_tflops']:.0f} TFLOP/s")
    lines = [
        *([f"**{emulated} emulation** on {meta['device']}: plans for compute capability 12.0, DISABLE_MMA_V3=1. "
           "'RTX PRO 6000 (projected)' is a projection, not a measurement: max(bytes / 1,792 GB/s, flops / "
           "(458 TFLOP/s x the fraction of the mma.sync ceiling reached here)).", ""] if emulated else []),
        f"GPU: {meta['device']}; torch {meta['torch']}, Triton {meta['triton']}; SGLang kernels from "
        f"{meta['sglang_wheel'] or '(not measured)'}. Copy ceiling {meta['copy_gbs']:.0f} GB/s, {ceiling}. "
        "Times in µs (median, device events); 'ours (graph)' is one call inside a replayed CUDA graph.",
        "",
        "| case | floor | ours (graph) | ours (eager) | GB/s | TFLOP/s | efficiency | SGLang extend (tree) "
        "| speed-up | SGLang split-KV (chain only) | torch gather+matmul | err vs SGLang | err vs fp64 |"
        + (" RTX PRO 6000 (projected) |" if emulated else ""),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if emulated else ""),
    ]
    for r in rows:
        d = derived(r)

        def f(x, fmt="{:.1f}"):
            return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)

        lines.append(
            f"| {Case(**r.case).label} | {f(r.floor_us)} | {f(r.ours_graph_us)} | {f(r.ours_us)} "
            f"| {f(d['gbs'], '{:.0f}')} "
            f"| {f(d['tflops'], '{:.0f}')} | {f(100 * d['efficiency'], '{:.0f}%')} | {f(r.sglang_extend_us, '{:.0f}')} "
            f"| {f(d['speedup_vs_sglang'], '{:.0f}×')} | {f(r.sglang_chain_us, '{:.0f}')} | {f(r.torch_us, '{:.0f}')} "
            f"| {f(r.err_vs_sglang, '{:.1e}')} | {f(r.err_vs_reference, '{:.1e}')} |"
            + (f" {f(r.projected_us)} |" if emulated else "")
        )
    return "\n".join(lines) + "\n"


def plot(rows: list[Row], path: Path, copy: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(12, 4.5))
    series = {
        "GLM-5 verify (bs1 H8 n9), ours": lambda c: (
            c.bs == 1 and c.H == 8 and c.n == 9 and not c.fp8 and c.slots == "scattered"
        ),
        "bs1 H16 n9, ours": lambda c: c.bs == 1 and c.H == 16 and c.n == 9 and not c.fp8,
    }
    for name, pick in series.items():
        pts = sorted((Case(**r.case).L, r) for r in rows if pick(Case(**r.case)))
        if not pts:
            continue
        Ls = [L for L, _ in pts]
        ax_t.plot(Ls, [r.ours_graph_us for _, r in pts], "o-", label=name)
        ax_b.plot(Ls, [derived(r)["gbs"] for _, r in pts], "o-", label=name)
        if "GLM-5" in name:
            ax_t.plot(
                Ls, [r.sglang_extend_us for _, r in pts], "s--", label="GLM-5 verify, SGLang extend_attention_fwd"
            )
            ax_t.plot(Ls, [r.floor_us for _, r in pts], ":", label="floor (copy / matmul ceiling)")
            ax_b.plot(
                Ls,
                [derived(r)["gbs"] * r.ours_graph_us / r.sglang_extend_us for _, r in pts],
                "s--",
                label="GLM-5 verify, SGLang extend_attention_fwd",
            )
    ax_b.axhline(copy, ls=":", color="gray", label=f"copy ceiling {copy:.0f} GB/s")
    ax_t.set(xscale="log", yscale="log", xlabel="prefix length L (tokens)", ylabel="µs per call (one layer)")
    ax_b.set(xscale="log", yscale="log", xlabel="prefix length L (tokens)", ylabel="KV GB/s")
    for ax in (ax_t, ax_b):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Tree-verify attention, page_size 1, bf16 KV")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _case(text: str) -> Case:
    parts = text.split(",")
    if len(parts) not in (4, 5) or (len(parts) == 5 and parts[4] != "fp8"):
        raise argparse.ArgumentTypeError(f"case {text!r}: write bs,L,H,n or bs,L,H,n,fp8 (e.g. 1,185000,8,9,fp8)")
    try:
        return Case(*(int(x) for x in parts[:4]), fp8=len(parts) == 5)
    except ValueError:
        raise argparse.ArgumentTypeError(f"case {text!r}: bs, L, H and n are integers") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sglang-wheel", help="SGLang release wheel to take the baseline kernels from")
    ap.add_argument("--out", default="bench-out", help="folder for bench.json, bench.md, bench.png, bench.log")
    ap.add_argument("--quick", action="store_true", help="three small cases (a smoke run)")
    ap.add_argument("--emulate", choices=sorted(EMULATIONS), help="measure another GPU's kernel path here (sm120)")
    ap.add_argument("--table", choices=sorted(BENCH_TABLES),
                    help="plan with this rule table instead of the GPU's (sm120-e4m3: the opt-in e4m3 fp8 tile)")
    ap.add_argument("--case", action="append", type=_case, help="bs,L,H,n[,fp8] instead of the full list (repeat)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("the benchmark needs a CUDA GPU", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sgl = None
    if args.sglang_wheel:
        from .sglang_wheel import load_sglang_attention

        sgl = load_sglang_attention(args.sglang_wheel)
    device = "cuda"
    emulation = enable_emulation(args.emulate, device) if args.emulate else {}
    target = Target.emulating(args.emulate, device) if args.emulate else None
    copy, mm = ceilings(device)
    floor_mm = emulation.get("mma_tflops", mm)  # under emulation the compute floor is mma.sync's
    meta = dict(
        device=torch.cuda.get_device_name(),
        torch=torch.__version__,
        triton=triton.__version__,
        table=args.table,
        sglang_wheel=Path(args.sglang_wheel).name if args.sglang_wheel else None,
        copy_gbs=copy,
        matmul_tflops=mm,
        date=time.strftime("%Y-%m-%d"),
        **emulation,
    )
    with (out / "bench.log").open("w") as log:

        def say(text: str) -> None:
            """Progress to stdout and to bench.log (kept whole where only the end of stdout survives)."""
            print(text, flush=True)
            log.write(text + "\n")
            log.flush()

        say(f"{meta['device']}: copy {copy:.0f} GB/s, matmul {mm:.0f} TFLOP/s"
            + (f"; {args.emulate} emulation: mma.sync GEMM {floor_mm:.0f} TFLOP/s ({emulation['mma_instruction']}), "
               f"e4m3 mma.sync GEMM {emulation['fp8_mma_tflops']:.0f} TFLOP/s ({emulation['fp8_mma_sass']})"
               if args.emulate else ""))
        rows = []
        cases = args.case or (QUICK if args.quick else FULL)
        table = BENCH_TABLES[args.table] if args.table else None
        for i, case in enumerate(cases, 1):
            row = measure(case, device, copy, floor_mm, sgl, target, table)
            if args.emulate:
                row.projected_us = projection(case, row.ours_graph_us, floor_mm)
            torch.cuda.empty_cache()
            rows.append(row)
            d = derived(row)
            say(f"[{i}/{len(cases)}] {case.label:28} ours {row.ours_graph_us:8.1f} µs ({d['gbs']:5.0f} GB/s, "
                f"{100 * d['efficiency']:3.0f}% of floor {row.floor_us:.1f}) sglang {row.sglang_extend_us:9.0f} µs "
                f"err {row.err_vs_sglang:.1e} / {row.err_vs_reference:.1e}"
                + (f" | RTX PRO 6000 projected {row.projected_us:.1f} µs" if args.emulate else ""))
            (out / "bench.json").write_text(json.dumps(dict(meta=meta, rows=[asdict(r) for r in rows]), indent=1))
        (out / "bench.md").write_text(markdown(rows, meta))
        plot(rows, out / "bench.png", copy)
        say(markdown(rows, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
