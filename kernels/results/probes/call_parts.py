"""Session 11: graph time of one verify call (GLM-5 by default) with its tree kernel, its merge, or both replaced by
no-ops (timing only: the output is wrong without them), at two lengths, for whichever ddtree_kernels is
first on PYTHONPATH. Which launch bounds the call once the prefix kernel gets faster?

    cd kernels && PYTHONPATH=../scratch/<copy>:. python3 results/probes/call_parts.py <label> [--whole] [bs,L,H,n ...]

--whole times the whole call only; cases default to GLM-5 at 64k and 185k.
"""
import sys

import torch

from ddtree_kernels import launcher
from ddtree_kernels.bench import Case, Problem, time_in_graphs
from ddtree_kernels.launcher import Workspace, plan_verify


class Skip:
    def __getitem__(self, grid):
        return lambda *a, **k: None


tag = sys.argv[1]
whole_only = "--whole" in sys.argv[2:]
cases = [Case(*(int(x) for x in a.split(","))) for a in sys.argv[2:] if a != "--whole"]
kernels = {"tree": launcher.tree_block_kernel, "merge": launcher.merge_parts_kernel}
for case in cases or (Case(1, 65536, 8, 9), Case(1, 185000, 8, 9)):
    p = Problem(case, "cuda")
    T = case.bs * case.n
    plan = plan_verify(case.bs, case.H, case.n, T, "cuda")
    ws = Workspace.for_plan(plan, "cuda")
    out = torch.empty(T, case.H, 512, dtype=torch.bfloat16, device="cuda")
    times = []
    for skipped in ((),) if whole_only else ((), ("tree",), ("merge",), ("tree", "merge")):
        for name, kernel in kernels.items():
            setattr(launcher, f"{name}_block_kernel" if name == "tree" else "merge_parts_kernel",
                    Skip() if name in skipped else kernel)
        us = time_in_graphs([lambda pool=pool, p=p, plan=plan, ws=ws, out=out: p.run_ours(plan, ws, out, pool)
                             for pool in p.pools])
        times.append(f"{'no ' + '+'.join(skipped) if skipped else 'whole':>15} {us:6.1f}")
    print(f"{tag:8} {case.label:22}" + "  ".join(times), flush=True)
    torch.cuda.empty_cache()
