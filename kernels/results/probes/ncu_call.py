"""One verify call of a bench case, for Nsight Compute: python3 scratch/ncu_call.py bs L H n [fp8]"""
import sys

import torch
from ddtree_kernels.bench import Case, Problem
from ddtree_kernels.launcher import Workspace, plan_verify

bs, L, H, n = map(int, sys.argv[1:5]); fp8 = len(sys.argv) > 5
case = Case(bs, L, H, n, fp8=fp8)
p = Problem(case, "cuda")
plan = plan_verify(bs, H, n, bs * n, "cuda", kv_fp8=fp8)
ws = Workspace.for_plan(plan, "cuda")
out = torch.empty(bs * n, H, 512, dtype=torch.bfloat16, device="cuda")
for _ in range(3):
    p.run_ours(plan, ws, out, p.next_pool())
torch.cuda.synchronize()
