"""Graph (and eager) time of one verify call with parts of the launch chain left out: the tree
kernel, the merge, or both replaced by no-ops (timing only: the outputs are wrong).

    cd kernels && PYTHONPATH=. python3 results/probes/chain_probe.py

Session 5, before the tree-first launch order and the read flush (do_bench zeroing its buffer).
"""
import sys
import torch
from ddtree_kernels import launcher
from ddtree_kernels.bench import Case, Problem, _time, time_in_graphs
from ddtree_kernels.launcher import Workspace, plan_verify

class Skip:
    def __getitem__(self, grid):
        return lambda *a, **k: None

real_tree, real_merge = launcher.tree_block_kernel, launcher.merge_parts_kernel
CASES = [Case(1, 185000, 8, 1), Case(1, 8192, 8, 9), Case(1, 65536, 8, 9), Case(1, 185000, 8, 9), Case(4, 185000, 8, 1)]
for case in CASES:
    p = Problem(case, "cuda")
    T = case.bs * case.n
    plan = plan_verify(case.bs, case.H, case.n, T, "cuda", kv_fp8=case.fp8)
    ws = Workspace.for_plan(plan, "cuda")
    out = torch.empty(T, case.H, 512, dtype=torch.bfloat16, device="cuda")
    res = []
    for label, tree, merge in (("full", real_tree, real_merge), ("no-tree", Skip(), real_merge),
                               ("prefix-only", Skip(), Skip()), ("no-merge", real_tree, Skip())):
        launcher.tree_block_kernel, launcher.merge_parts_kernel = tree, merge
        us = time_in_graphs([lambda pool=pool: p.run_ours(plan, ws, out, pool) for pool in p.pools])
        eager = _time(lambda: p.run_ours(plan, ws, out, p.next_pool()))
        res.append(f"{label} {us:6.1f} (eager {eager:6.1f})")
    launcher.tree_block_kernel, launcher.merge_parts_kernel = real_tree, real_merge
    print(f"{case.label:24} " + "  ".join(res) + f"  | splits {plan.num_splits}", flush=True)
    del p
    torch.cuda.empty_cache()
