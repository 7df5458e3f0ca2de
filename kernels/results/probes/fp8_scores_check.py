"""Session 6: the fp8-scores tiles (needs kernels/results/probes/fp8_scores.patch applied on e84ea2b) against the
float64 reference: fp8 cache, GLM-5-like (72 rows a request) and decode requests, V from K and apart. On a GPU:
PYTHONPATH=kernels:. python3 kernels/results/probes/fp8_scores_check.py"""
import dataclasses, sys
sys.path.insert(0, "tests")
import torch
from ddtree_kernels.configs import HOPPER
from ddtree_kernels.launcher import plan_verify, cache_layout
from kernels.test_correctness import _run_planned
from kernels.cases import make_case, assert_close
DEV = "cuda" if torch.cuda.is_available() else "cpu"
PREFIX = [0, 7000, 50001] if DEV == "cuda" else [0, 700, 1301]
f = lambda t: dataclasses.replace(t, fp8_scores=True)
cfg = dataclasses.replace(HOPPER, min_chunk=64, prefix_fp8=f(HOPPER.prefix_fp8), prefix_wide_fp8=f(HOPPER.prefix_wide_fp8))
for draft in ([9, 5, 9], [1, 1, 1]):
    for separate_v in (False, True):
        case = make_case(PREFIX, draft, 8, DEV, kv_dtype=torch.float8_e4m3fn, separate_v=separate_v)
        kv_fp8, v_from_k = cache_layout(case.k_cache, case.v_cache)
        plan = plan_verify(3, 8, case.max_draft, case.q.shape[0], DEV, config=cfg, kv_fp8=kv_fp8, v_from_k=v_from_k)
        out = _run_planned(plan, case); ref = case.reference()[0]
        err = ((out.double().cpu() - ref).norm() / ref.norm()).item()
        assert_close(out, ref, case)
        print("ok", draft, separate_v, f"rel err {err:.2e}", flush=True)
