"""Session 9: graph time of the prefix kernel alone (tree and merge replaced by no-ops: timing only) for
Gluon shapes at two lengths, for whichever ddtree_kernels is first on PYTHONPATH. Run against the shipped
kernel and two copies of it (scratch, not committed): one without the wgmmas and softmax (gather only),
one without the gathers after the first tiles (compute only); the slope over the two lengths is the time
of a key tile.

    cd kernels && PYTHONPATH=../scratch/<copy>:. python3 results/probes/pipeline_split.py <label>
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
launcher.tree_block_kernel, launcher.merge_parts_kernel = Skip(), Skip()
for case in (Case(1, 65536, 8, 9), Case(1, 185000, 8, 9), Case(1, 65536, 64, 1), Case(1, 185000, 64, 1)):
    p = Problem(case, "cuda")
    T = case.bs * case.n
    plan = plan_verify(case.bs, case.H, case.n, T, "cuda")
    ws = Workspace.for_plan(plan, "cuda")
    out = torch.empty(T, case.H, 512, dtype=torch.bfloat16, device="cuda")
    us = time_in_graphs([lambda pool=pool: p.run_ours(plan, ws, out, pool) for pool in p.pools])
    steps = -(-(-(-case.L // plan.num_splits)) // 64)
    print(f"{tag:10} {case.label:22} prefix-only {us:7.1f} us  splits {plan.num_splits}  key tiles a split {steps}", flush=True)
    del p
    torch.cuda.empty_cache()
