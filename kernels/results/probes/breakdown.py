"""Whole-call CUDA-graph time and per-kernel device time (torch.profiler, eager) of a few cases.

    PYTHONPATH=kernels python3 kernels/results/probes/breakdown.py <label> [nopdl]

PYTHONPATH picks the ddtree_kernels to measure (a copy of an older commit for A/B). With
programmatic dependent launch the tree and merge durations include their wait on the prefix
kernel, and with a row tail 'prefix_split' averages the two prefix launches.
"""
import dataclasses
import sys

import torch
from ddtree_kernels import configs
from ddtree_kernels.bench import Case, Problem, time_in_graphs
from ddtree_kernels.launcher import Workspace, plan_verify
from torch.profiler import ProfilerActivity, profile

label = sys.argv[1]
cfg = None
if len(sys.argv) > 2 and sys.argv[2] == "nopdl":
    cfg = dataclasses.replace(configs.HOPPER, pdl=False)
CASES = [Case(1, 185000, 8, 1), Case(1, 185000, 8, 1, fp8=True), Case(4, 185000, 8, 1), Case(1, 8192, 8, 9),
         Case(1, 65536, 8, 9), Case(1, 185000, 8, 9), Case(1, 185000, 16, 9), Case(1, 185000, 8, 33),
         Case(1, 65536, 16, 33), Case(4, 65536, 8, 9), Case(1, 65536, 8, 17), Case(1, 185000, 8, 9, fp8=True)]
for case in CASES:
    p = Problem(case, "cuda")
    T = case.bs * case.n
    plan = plan_verify(case.bs, case.H, case.n, T, "cuda", kv_fp8=case.fp8, **({"config": cfg} if cfg else {}))
    ws = Workspace.for_plan(plan, "cuda")
    out = torch.empty(T, case.H, 512, dtype=torch.bfloat16, device="cuda")
    g_us = time_in_graphs([lambda pool=pool: p.run_ours(plan, ws, out, pool) for pool in p.pools])
    for _ in range(3):
        p.run_ours(plan, ws, out, p.next_pool())
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            p.run_ours(plan, ws, out, p.next_pool())
        torch.cuda.synchronize()
    ks = {}
    for e in prof.key_averages():
        if "kernel" in e.key:
            ks[e.key.split("_kernel")[0]] = e.device_time_total / e.count if hasattr(e, "device_time_total") else e.cuda_time_total / e.count
    parts = "  ".join(f"{k} {v:6.1f}" for k, v in ks.items())
    print(f"{label:10} {case.label:24} graph {g_us:7.1f} µs | {parts} | splits {plan.num_splits}", flush=True)
    del p
    torch.cuda.empty_cache()
