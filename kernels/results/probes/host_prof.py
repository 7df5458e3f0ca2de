"""cProfile of 300 eager verify calls (host side): where the launch time goes."""
import cProfile, pstats, torch
from ddtree_kernels.bench import Case, Problem
from ddtree_kernels.launcher import Workspace, plan_verify
case = Case(1, 185000, 8, 1)
p = Problem(case, "cuda")
plan = plan_verify(1, 8, 1, 1, "cuda")
ws = Workspace.for_plan(plan, "cuda")
out = torch.empty(1, 8, 512, dtype=torch.bfloat16, device="cuda")
pool = p.pools[0]
for _ in range(5):
    p.run_ours(plan, ws, out, pool)
torch.cuda.synchronize()
pr = cProfile.Profile()
pr.enable()
for _ in range(300):
    p.run_ours(plan, ws, out, pool)
pr.disable()
torch.cuda.synchronize()
pstats.Stats(pr).sort_stats("tottime").print_stats(14)
