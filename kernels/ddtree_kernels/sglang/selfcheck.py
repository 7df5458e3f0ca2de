"""Run the kernels on this machine against the float64 reference, for the shape a server will serve.

    python -m ddtree_kernels.sglang.selfcheck --heads 8 --draft 9 --kv-cache-dtype bfloat16 [--json]

The deploy runs this with a new release's own venv on the host's own GPU before it switches to the
release (roles/ddtree/tasks/selfcheck.yml): a kernel that computes wrong on that GPU (an sm_120 card
nothing here has run it on, a Triton the release pins) is caught before users get wrong tokens. Cases:
the served shape (one request, a random tree of `--draft` tokens, a prefix that is not a multiple of any
tile, random slots), the same heads with ragged requests (an empty prefix, a one-token one, a decode
step), and a single-token decode. Without a GPU it runs under Triton's interpreter (set TRITON_INTERPRET=1
before starting Python) on small prefixes. Exit 1, with each case's relative error, if any case misses.
`--dsa`: the DSA tree verify a DSA checkpoint (GLM-5) is served with instead (the deploy runs it when the launch
check finds one).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass

import torch

from ..launcher import plan_verify
from ..masks import parents_to_visibility, random_parents
from ..reference import tree_verify_reference
from .adapter import sglang_verify_fwd

# ||out - ref|| / ||ref|| allowed: bf16 operands land between 1e-3 and 1e-2; fp8 keys and values
# carry 3 mantissa bits.
TOLERANCE = {"bfloat16": 2e-2, "float16": 2e-2, "fp8_e4m3": 6e-2}
CACHE_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.bfloat16, "auto": torch.bfloat16,
                "fp8_e4m3": torch.float8_e4m3fn}


@dataclass
class CaseResult:
    name: str
    prefixes: list[int]
    drafts: list[int]
    heads: int
    rel_error: float
    tolerance: float
    ok: bool


def run_case(name: str, prefixes: list[int], drafts: list[int], heads: int, kv_dtype: str, device: str,
             gen: torch.Generator) -> CaseResult:
    """One verify call through SGLang's hook (flat mask, as the server calls it) against the reference."""
    from ..masks import visibility_to_sglang_flat

    d_v, d_r = 512, 64
    bs, T = len(prefixes), sum(drafts)
    qo = torch.zeros(bs + 1, dtype=torch.int32)
    qo[1:] = torch.cumsum(torch.tensor(drafts), 0)
    kv = torch.zeros(bs + 1, dtype=torch.int32)
    kv[1:] = torch.cumsum(torch.tensor(prefixes), 0)
    pool = sum(prefixes) + 64
    slots = torch.randperm(pool, generator=gen)[: sum(prefixes)]
    cache = torch.randn(pool, 1, d_v + d_r, generator=gen)
    scale = 0.5 if kv_dtype == "fp8_e4m3" else 1.0
    k_cache = (cache / scale).to(CACHE_DTYPES[kv_dtype])
    q = torch.randn(T, heads, d_v + d_r, generator=gen).to(torch.bfloat16)
    k_draft = torch.randn(T, 1, d_v + d_r, generator=gen).to(torch.bfloat16)
    vis = parents_to_visibility(random_parents(drafts, gen), qo, max(drafts))
    flat, mask_indptr = visibility_to_sglang_flat(vis, qo, kv)
    out = torch.full((T, heads, d_v), float("nan"), dtype=torch.bfloat16)
    moved = [t.to(device) for t in (q, k_draft, out, k_cache, qo, kv, slots, flat, mask_indptr)]
    q_d, kd_d, out_d, kc_d, qo_d, kv_d, slots_d, flat_d, mi_d = moved
    served = sglang_verify_fwd(q_d, kd_d, kd_d[..., :d_v], out_d, kc_d, kc_d[..., :d_v], qo_d, kv_d, slots_d, flat_d,
                               True, mi_d, max(drafts), scale, scale, 1 / 16)
    if not served:
        raise RuntimeError(f"the kernel declined case {name}: see the ddtree-sm120 warning above")
    ref, _ = tree_verify_reference(q, k_cache, k_cache[..., :d_v], kv, slots, k_draft, k_draft, qo, vis, 1 / 16,
                                   scale, scale, d_v=d_v)
    got = out_d.double().cpu()
    err = float("inf") if torch.isnan(got).any() else float((got - ref).norm() / ref.norm())
    tol = TOLERANCE.get(kv_dtype, 2e-2)
    return CaseResult(name, prefixes, drafts, heads, err, tol, err <= tol)


def self_check(heads: int, draft: int, kv_dtype: str = "bfloat16", seed: int = 0) -> list[CaseResult]:
    gpu = torch.cuda.is_available()
    if not gpu and os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("no GPU here: run with TRITON_INTERPRET=1 in the environment (set before Python starts)")
    device = "cuda" if gpu else "cpu"
    long, short = (8191, 3000) if gpu else (257, 65)  # not multiples of any tile
    gen = torch.Generator().manual_seed(seed)
    cases = [("served shape", [long], [draft]),
             ("ragged requests", [0, 1, short], [draft, max(1, draft - 2), 1]),
             ("decode", [short], [1])]
    return [run_case(name, p, d, heads, kv_dtype, device, gen) for name, p, d in cases]


def run_dsa_case(name: str, prefixes: list[int], drafts: list[int], heads: int, topk: int, device: str,
                 gen: torch.Generator) -> CaseResult:
    """One DSA tree verify (indexer, top-k, sparse MLA; GLM-5's 32 index heads) against the float64 reference."""
    from ..dsa import act_quant, dsa_tree_verify, dsa_tree_verify_reference, new_index_buffer, write_index_keys

    bs, T = len(prefixes), sum(drafts)
    qo = torch.zeros(bs + 1, dtype=torch.int32)
    qo[1:] = torch.cumsum(torch.tensor(drafts), 0)
    kv = torch.zeros(bs + 1, dtype=torch.int32)
    kv[1:] = torch.cumsum(torch.tensor(prefixes), 0)
    pool = sum(prefixes) + T + 64
    perm = torch.randperm(pool, generator=gen)
    slots, tree_slots = perm[: sum(prefixes)], perm[sum(prefixes): sum(prefixes) + T]
    k_cache = torch.randn(pool, 1, 576, generator=gen).to(torch.bfloat16)
    index_buf = new_index_buffer(pool, "cpu")
    write_index_keys(index_buf, torch.arange(pool), torch.randn(pool, 128, generator=gen))
    index_q, q_scale = act_quant(torch.randn(T, 32, 128, generator=gen))
    weights = (torch.randn(T, 32, generator=gen) * 32**-0.5 * q_scale * 128**-0.5).float()
    q = torch.randn(T, heads, 576, generator=gen).to(torch.bfloat16)
    vis = parents_to_visibility(random_parents(drafts, gen), qo, max(drafts))
    args = (q, k_cache, kv, slots, qo, tree_slots, vis, index_q, weights, index_buf)
    out = dsa_tree_verify(*(t.to(device) for t in args), sm_scale=1 / 16, topk=topk, max_context=max(prefixes))
    ref, _ = dsa_tree_verify_reference(*args, topk=topk, sm_scale=1 / 16)
    got = out.double().cpu()
    err = float("inf") if torch.isnan(got).any() else float((got - ref).norm() / ref.norm())
    tol = TOLERANCE["bfloat16"]
    return CaseResult(name, prefixes, drafts, heads, err, tol, err <= tol)


def dsa_self_check(heads: int, draft: int, seed: int = 0) -> list[CaseResult]:
    """The DSA tree verify a DSA checkpoint (GLM-5) is served with: top 2,048 of a long prefix on a GPU; under the
    interpreter a top 64 of a short one (the same kernels, fewer keys)."""
    gpu = torch.cuda.is_available()
    if not gpu and os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("no GPU here: run with TRITON_INTERPRET=1 in the environment (set before Python starts)")
    device = "cuda" if gpu else "cpu"
    gen = torch.Generator().manual_seed(seed)
    if gpu:
        return [run_dsa_case("DSA served shape", [8191], [draft], heads, 2048, device, gen),
                run_dsa_case("DSA ragged requests", [0, 1500, 3000], [draft, max(1, draft - 2), 1], heads, 2048,
                             device, gen)]
    return [run_dsa_case("DSA served shape", [129], [draft], heads, 64, device, gen)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=int, required=True, help="query heads a GPU serves (GLM-5 at TP 8: 8)")
    ap.add_argument("--draft", type=int, required=True, help="verify width: the DDTree budget + 1")
    ap.add_argument("--kv-cache-dtype", default="bfloat16", choices=sorted(CACHE_DTYPES))
    ap.add_argument("--dsa", action="store_true",
                    help="check the DSA tree verify (a DSA checkpoint served sparse) instead of the dense one")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    where = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU, Triton interpreter"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.dsa:
        from ..dsa import plan_dsa_verify

        results = dsa_self_check(args.heads, args.draft)
        plan = plan_dsa_verify(1, args.heads, args.draft, args.draft, 8192, device)
        return _report(results, plan, [plan.tiles.name], f"DSA self-check on {where}", where, args.json)
    results = self_check(args.heads, args.draft, args.kv_cache_dtype)
    # What the served shape ran: the target it was planned for and each kernel it launched.
    plan = plan_verify(1, args.heads, args.draft, args.draft, device, kv_fp8=args.kv_cache_dtype == "fp8_e4m3")
    return _report(results, plan, [launch.kernel for launch in plan.launches()], f"self-check on {where}", where,
                   args.json)


def _report(results: list[CaseResult], plan, kernels: list[str], title: str, where: str, as_json: bool) -> int:
    """Print the cases (one JSON line for the deploy, or a table); 0 if every case passed."""
    ok = all(r.ok for r in results)
    if as_json:
        print(json.dumps({"device": where, "target": str(plan.target), "kernels": kernels, "ok": ok,
                          "cases": [asdict(r) for r in results]}))
    else:
        print(plan.describe())
        for r in results:
            print(f"{'PASS' if r.ok else 'FAIL'}  {r.name}: {r.heads} heads, prefixes {r.prefixes}, drafts {r.drafts}: "
                  f"relative error {r.rel_error:.2e} (allowed {r.tolerance:.0e})")
        print(f"ddtree_kernels {title}: {'passed' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
