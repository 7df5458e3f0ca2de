"""Session 10: when each kernel of one eager verify call starts and ends on the GPU (torch.profiler / CUPTI),
GLM-5 at 185k and 64k with the shipped config: the tree kernel, the prefix kernel, the merge.

    cd kernels && PYTHONPATH=. python3 results/probes/kernel_timeline.py
"""
import torch
from torch.profiler import ProfilerActivity, profile

from ddtree_kernels.bench import Case, Problem
from ddtree_kernels.launcher import Workspace, plan_verify

for case in (Case(1, 185000, 8, 9), Case(1, 65536, 8, 9)):
    p = Problem(case, "cuda")
    T = case.bs * case.n
    plan = plan_verify(case.bs, case.H, case.n, T, "cuda")
    ws = Workspace.for_plan(plan, "cuda")
    out = torch.empty(T, case.H, 512, dtype=torch.bfloat16, device="cuda")
    for _ in range(5):
        p.run_ours(plan, ws, out, p.next_pool())
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            p.run_ours(plan, ws, out, p.next_pool())
            torch.cuda.synchronize()
    kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    t0 = None
    for e in kernels:
        name = e.name.split("(")[0][:30]
        if "tree_block" in name:
            t0 = e.time_range.start  # each call starts with the tree kernel
            print(f"{case.label}:")
        if t0 is not None:
            print(f"  {name:30} start {e.time_range.start - t0:8.1f} µs  end {e.time_range.end - t0:8.1f} µs  "
                  f"({e.time_range.elapsed_us():7.1f} µs)")
    del p
    torch.cuda.empty_cache()
