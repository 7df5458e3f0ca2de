"""Session 6: is the wide tile bound by its gather or by its compute? Shipped config, GLM-5 and three
other shapes, slots scattered over the pool (as the bench) against the same count of slots confined
to the first 16,384 or 2,048 rows, which L2 holds. python3 kernels/results/probes/hot_keys.py"""
import torch
from ddtree_kernels.bench import Case, Problem, time_in_graphs
from ddtree_kernels.launcher import Workspace, plan_verify

for bs, L, H, n in ((1, 185000, 8, 9), (1, 65536, 8, 9), (1, 185000, 8, 1), (1, 185000, 16, 33)):
    case = Case(bs, L, H, n)
    p = Problem(case, "cuda")
    plan = plan_verify(bs, H, n, bs * n, "cuda")
    ws = Workspace.for_plan(plan, "cuda")
    out = torch.empty(bs * n, H, 512, dtype=torch.bfloat16, device="cuda")
    res = {}
    for label, rows in (("scattered", None), ("hot 16384 rows", 16384), ("hot 2048 rows", 2048)):
        pools = p.pools if rows is None else [(k, idx % rows) for k, idx in p.pools]
        res[label] = time_in_graphs([lambda pool=pool: p.run_ours(plan, ws, out, pool) for pool in pools])
    print(case.label, " ".join(f"{k} {v:.1f} µs" for k, v in res.items()), f"splits {plan.num_splits}", flush=True)
    del p
    torch.cuda.empty_cache()
