"""Session 10: where the merge's ~7 µs and the tree kernel's ~5 µs (GLM-5 185k) go. Graph time of one verify
call with the merge as shipped, replaced by a kernel of the same grid that only waits for the prefix grid
(griddepcontrol.wait: the dependency hop alone), by one program that waits, and left out; then with the
tree kernel replaced by one of its grid that returns at once (its programs' time on the SMs gone, the
launch kept) and left out (timing only: outputs wrong).

    cd kernels && PYTHONPATH=. python3 results/probes/merge_probe.py
"""
import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ddtree_kernels import launcher
from ddtree_kernels.bench import Case, Problem, time_in_graphs
from ddtree_kernels.launcher import Workspace, plan_verify


@triton.jit
def wait_kernel(Out, USE_PDL: tl.constexpr):
    if USE_PDL:
        gdc_wait()


@triton.jit
def tree_returns_kernel(Q, USE_PDL: tl.constexpr):
    if USE_PDL:
        gdc_launch_dependents()


class TreeReturns:
    """The tree kernel's grid and launch options, each program returning at once."""

    def __getitem__(self, grid):
        def launch(q, *args, USE_PDL, num_warps, num_stages, **kw):
            tree_returns_kernel[grid](q, USE_PDL=USE_PDL, num_warps=num_warps, num_stages=num_stages)
        return launch


class WaitOnly:
    """The merge's grid and launch options, each program only waiting for the grid before it."""

    def __init__(self, one_program: bool):
        self.one = one_program

    def __getitem__(self, grid):
        def launch(o_part, lse_part, out, *args, USE_PDL, num_warps, launch_pdl, **kw):
            wait_kernel[(1,) if self.one else grid](out, USE_PDL=USE_PDL, num_warps=num_warps, launch_pdl=launch_pdl)
        return launch


class Skip:
    def __getitem__(self, grid):
        return lambda *a, **k: None


real, real_tree = launcher.merge_parts_kernel, launcher.tree_block_kernel
CASES = [Case(1, 8192, 8, 9), Case(1, 65536, 8, 9), Case(1, 185000, 8, 9), Case(1, 185000, 8, 1)]
for case in CASES:
    p = Problem(case, "cuda")
    T = case.bs * case.n
    plan = plan_verify(case.bs, case.H, case.n, T, "cuda", kv_fp8=case.fp8)
    ws = Workspace.for_plan(plan, "cuda")
    out = torch.empty(T, case.H, 512, dtype=torch.bfloat16, device="cuda")
    res = []
    for label, merge, tree in (("shipped", real, real_tree), ("wait-only", WaitOnly(False), real_tree),
                               ("one-wait", WaitOnly(True), real_tree), ("no-merge", Skip(), real_tree),
                               ("tree-returns", real, TreeReturns()), ("no-tree", real, Skip())):
        launcher.merge_parts_kernel, launcher.tree_block_kernel = merge, tree
        us = time_in_graphs([lambda pool=pool: p.run_ours(plan, ws, out, pool) for pool in p.pools])
        res.append(f"{label} {us:6.1f}")
    launcher.merge_parts_kernel, launcher.tree_block_kernel = real, real_tree
    print(f"{case.label:24} " + "  ".join(res) + f"  | splits {plan.num_splits}, merge grid {plan.merge_grid[0]}",
          flush=True)
    del p
    torch.cuda.empty_cache()
print(f"Triton {triton.__version__}, {torch.cuda.get_device_name()}")
