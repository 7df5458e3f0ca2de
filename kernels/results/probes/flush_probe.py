"""Does do_bench's L2 flush (zeroing 256 MB: ~50 MB of dirty lines left in L2) add write-back time to a
short kernel? Time the same graphs with do_bench's flush (zero), a read flush (clean lines), none.

    cd kernels && PYTHONPATH=. python3 results/probes/flush_probe.py
"""
import torch
import triton
from triton import runtime
from ddtree_kernels import launcher
from ddtree_kernels.bench import Case, Problem, ceilings, time_in_graphs
from ddtree_kernels.launcher import Workspace, plan_verify

drv = runtime.driver.active
zero_clear = drv.clear_cache
sink = torch.empty((), dtype=torch.int64, device="cuda")
FLUSHES = {"zero": zero_clear, "read": lambda c: torch.sum(c, dim=0, out=sink), "none": lambda c: None}

class Skip:
    def __getitem__(self, grid):
        return lambda *a, **k: None

real_tree, real_merge = launcher.tree_block_kernel, launcher.merge_parts_kernel
for name, fl in FLUSHES.items():
    drv.clear_cache = fl
    copy, mm = ceilings("cuda")
    print(f"flush {name:5} copy {copy:6.0f} GB/s matmul {mm:4.0f} TFLOP/s", flush=True)
CASES = [Case(1, 185000, 8, 1), Case(1, 185000, 8, 1, fp8=True), Case(1, 8192, 8, 9), Case(1, 65536, 8, 9),
         Case(1, 185000, 8, 9), Case(4, 185000, 8, 1)]
for case in CASES:
    p = Problem(case, "cuda")
    T = case.bs * case.n
    plan = plan_verify(case.bs, case.H, case.n, T, "cuda", kv_fp8=case.fp8)
    ws = Workspace.for_plan(plan, "cuda")
    out = torch.empty(T, case.H, 512, dtype=torch.bfloat16, device="cuda")
    res = []
    for label, tree, merge in (("full", real_tree, real_merge), ("prefix-only", Skip(), Skip())):
        launcher.tree_block_kernel, launcher.merge_parts_kernel = tree, merge
        for name, fl in FLUSHES.items():
            drv.clear_cache = fl
            us = time_in_graphs([lambda pool=pool: p.run_ours(plan, ws, out, pool) for pool in p.pools])
            res.append(f"{label}/{name} {us:6.1f}")
    launcher.tree_block_kernel, launcher.merge_parts_kernel = real_tree, real_merge
    drv.clear_cache = zero_clear
    print(f"{case.label:24} " + "  ".join(res) + f"  | pools {len(p.pools)}", flush=True)
    del p
    torch.cuda.empty_cache()
