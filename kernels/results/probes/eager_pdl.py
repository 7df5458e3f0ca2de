"""Eager (no graph) time of one verify call with PDL on and off, and the host's launch cost per call."""
import dataclasses, time, torch, triton
from ddtree_kernels.bench import Case, Problem
from ddtree_kernels.launcher import Workspace, plan_verify
from ddtree_kernels import configs
for case in (Case(1, 8192, 8, 9), Case(1, 185000, 8, 1), Case(1, 65536, 8, 9)):
    p = Problem(case, "cuda")
    T = case.bs * case.n
    out = torch.empty(T, case.H, 512, dtype=torch.bfloat16, device="cuda")
    for pdl in ((True, False, True, False) if hasattr(configs.HOPPER, "pdl") else (None, None)):
        cfg = dataclasses.replace(configs.HOPPER, pdl=pdl) if pdl is not None else configs.HOPPER
        plan = plan_verify(case.bs, case.H, case.n, T, "cuda", config=cfg)
        ws = Workspace.for_plan(plan, "cuda")
        fn = lambda: p.run_ours(plan, ws, out, p.next_pool())
        fn(); torch.cuda.synchronize()
        eager = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3
        torch.cuda.synchronize(); t0 = time.perf_counter()
        for _ in range(200):
            fn()
        host = (time.perf_counter() - t0) / 200 * 1e6
        torch.cuda.synchronize()
        print(f"{case.label:24} pdl={pdl!s:5} eager {eager:7.1f} µs  host launch {host:6.1f} µs/call", flush=True)
