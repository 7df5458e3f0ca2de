"""Whole-call graph time under do_bench's zeroing L2 flush and under a read flush, for one
ddtree_kernels (PYTHONPATH), and the output of pool 0 saved for a bit-exact A/B.

    cd kernels && PYTHONPATH=<copy of f3371fa>/kernels python3 results/probes/flush_ab.py base
    cd kernels && PYTHONPATH=. python3 results/probes/flush_ab.py new   # then compare /tmp/out_*.pt

Session 5: the tree-first launch order (new) against commit f3371fa (base), run base/new twice.
"""
import sys
import torch
from triton import runtime
from ddtree_kernels.bench import Case, Problem, time_in_graphs
from ddtree_kernels.launcher import Workspace, plan_verify

drv = runtime.driver.active
zero_clear = drv.clear_cache
sink = torch.empty((), dtype=torch.int64, device="cuda")
read_clear = lambda c: torch.sum(c, dim=0, out=sink)
CASES = [Case(1, 185000, 8, 1), Case(1, 8192, 8, 9), Case(1, 65536, 8, 9), Case(1, 185000, 8, 9),
         Case(1, 185000, 16, 9), Case(4, 185000, 8, 1), Case(1, 65536, 16, 33)]
for case in CASES:
    torch.manual_seed(0)
    p = Problem(case, "cuda")
    T = case.bs * case.n
    plan = plan_verify(case.bs, case.H, case.n, T, "cuda", kv_fp8=case.fp8)
    ws = Workspace.for_plan(plan, "cuda")
    out = torch.empty(T, case.H, 512, dtype=torch.bfloat16, device="cuda")
    res = []
    for name, fl in (("zero", zero_clear), ("read", read_clear)):
        drv.clear_cache = fl
        us = time_in_graphs([lambda pool=pool: p.run_ours(plan, ws, out, pool) for pool in p.pools])
        res.append(f"{name} {us:6.1f}")
    drv.clear_cache = zero_clear
    p.run_ours(plan, ws, out, p.pools[0])
    torch.save(out.float().cpu(), f"/tmp/out_{sys.argv[1]}_{case.label.replace(' ', '_')}.pt")
    print(f"{sys.argv[1]:5} {case.label:24} " + "  ".join(res), flush=True)
    del p
    torch.cuda.empty_cache()
