"""GPU-only checks: realistic sizes, CUDA-graph replay with new contents, no host sync.

Marked `gpu`; `make test` deselects them on machines without CUDA and
`make test-gpu` runs them (see kernels/README.md for the command and last result).
"""

from __future__ import annotations

import pytest
import torch

from ddtree_kernels import masks, reference
from ddtree_kernels.launcher import plan_verify, reserve_workspace
from ddtree_kernels.sglang import sglang_verify_fwd

from .cases import TARGET, assert_close, make_case

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run with make test-gpu)"),
]
FP8 = torch.float8_e4m3fn

LARGE = [
    # (prefix lengths, draft lengths, heads, options, the Hopper path the case is for: "ws" the warp-specialized
    # Gluon wide tile, "wide" its one-stream form, "narrow" the keys-major Gluon tile; elsewhere "triton")
    ([185_000], [9], 8, {}, "ws"),  # GLM-5 at TP 8 (its last 3 splits 3 key tiles shorter: split_reserve)
    ([8_192], [9], 8, {}, "ws"),  # ... most splits empty (the last 3 no keys): the ws tile stores empty parts
    ([65_536], [9], 16, {}, "ws"),  # two blocks a split, the last 3 splits 3 key tiles shorter (late_keys)
    ([185_000], [9], 16, {"kv_dtype": FP8}, "wide"),
    ([185_000], [33], 16, {}, "ws"),
    ([131_072, 3], [65, 1], 8, {"kv_dtype": FP8}, "wide"),
    ([65_536] * 4, [9] * 4, 16, {}, "ws"),
    ([32_768] * 8, [9] * 8, 16, {"slots": "contiguous"}, "ws"),
    ([40_000, 0, 7, 100_003], [9, 9, 1, 17], 64, {}, "wide"),  # data-parallel attention: all 64 heads
    ([185_000], [1], 8, {"kv_dtype": FP8}, "narrow"),  # plain decode through the same kernels
    # Hopper's Gluon wide tile with the 8-row tail in its last block, beside requests with fewer rows,
    # a short prefix, an empty one (every split empty) and one shorter than a key tile
    ([100_003, 50, 0, 3_001, 200_000], [9, 9, 9, 1, 5], 8, {}, "ws"),
    ([65_536, 65_536], [9, 9], 8, {"kv_dtype": torch.float16, "q_dtype": torch.float16}, "ws"),
    # ... with the rows past its whole blocks spread over them (264 rows: four blocks of 66), beside
    # requests that end inside a block's tail and inside its first 64 rows
    ([70_000, 1_000, 129], [33, 17, 7], 8, {}, "ws"),
    # Hopper's keys-major Gluon tile (requests of at most 16 rows): decode beside a short, an empty and a
    # sub-tile prefix; 8 and 4 rows on an fp8 cache; 6 rows of fp16; 16 rows (N 16), beside 8 on fp8
    ([185_000, 4_097, 0, 63], [1, 1, 1, 1], 8, {}, "narrow"),
    ([50_000, 700], [2, 1], 4, {"kv_dtype": FP8}, "narrow"),
    ([30_000], [3], 2, {"kv_dtype": torch.float16, "q_dtype": torch.float16}, "narrow"),
    ([90_000, 5_000, 0], [1, 1, 1], 16, {}, "narrow"),  # 16 rows a request: N 16
    ([40_000, 333], [2, 1], 8, {"kv_dtype": FP8}, "narrow"),  # 16 and 8 rows beside each other
    # 17-63 rows on Hopper's Gluon wide tile as one block, the rows past the request masked (beside
    # requests of as many rows, of 16 and 8, and an empty prefix)
    ([120_000, 2_000, 0], [3, 3, 1], 8, {}, "wide"),
    ([60_000, 999], [7, 2], 8, {"kv_dtype": FP8}, "wide"),
    ([33_333, 64], [5, 5], 8, {"kv_dtype": torch.float16, "q_dtype": torch.float16}, "wide"),
]


def _path(plan) -> str:
    """Which prefix kernel a plan runs, from its launches (VerifyPlan.launches)."""
    prefix = plan.launches()[1:-1]
    kernels = {launch.kernel for launch in prefix}
    if kernels <= {"prefix_general", "prefix_chunked", "prefix_latent_split", "prefix_latent_split_fp8"}:
        return "triton"
    if "hopper_wgmma_ws" in kernels:
        return "ws"
    return "narrow" if any("BLOCK_M 0 " in launch.tile for launch in prefix) else "wide"


def _gluon_here() -> bool:
    """Hopper's Gluon tiles run on the target the suite plans for (a Hopper GPU, not emulating sm_120)."""
    return TARGET.capability == (9, 0) and TARGET.compiled_gluon


@pytest.mark.parametrize("prefix,draft,heads,opts,hopper_path", LARGE, ids=lambda x: str(x)[:40])
def test_large_cases_match_reference(prefix, draft, heads, opts, hopper_path):
    case = make_case(prefix, draft, heads, "cuda", **opts)
    plan = plan_verify(len(prefix), heads, max(draft), sum(draft), TARGET, kv_fp8=opts.get("kv_dtype") == FP8)
    assert _path(plan) == (hopper_path if _gluon_here() else "triton"), plan.describe()
    out = torch.full((case.q.shape[0], heads, 512), float("nan"), dtype=case.q.dtype, device="cuda")
    assert sglang_verify_fwd(
        case.q, case.k_draft, case.v_draft, out, case.k_cache, case.v_cache, case.qo_indptr, case.kv_indptr,
        case.kv_indices, case.custom_mask, True, case.mask_indptr, case.max_draft,
        case.k_scale, case.v_scale, case.sm_scale, target=TARGET,
    )
    torch.cuda.synchronize()
    assert_close(out, case.reference()[0], case)


def test_no_host_synchronisation():
    case = make_case([20_000, 333], [9, 9], 8, "cuda", kv_dtype=FP8)
    out = torch.empty((18, 8, 512), dtype=torch.bfloat16, device="cuda")
    scale = torch.tensor(case.k_scale, device="cuda")
    args = (case.q, case.k_draft, case.v_draft, out, case.k_cache, case.v_cache, case.qo_indptr, case.kv_indptr,
            case.kv_indices, case.custom_mask, True, case.mask_indptr, 9, scale, scale, case.sm_scale)
    assert sglang_verify_fwd(*args, target=TARGET)  # compile outside the check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        assert sglang_verify_fwd(*args, target=TARGET)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert_close(out, case.reference()[0], case)


def test_cuda_graph_replay_with_new_contents():
    """Capture once at the largest shape; replay with new prefixes, trees, slots and values."""
    bs, n, H, d_qk, d_v = 3, 17, 8, 576, 512
    max_prefix, pool = 50_000, 200_000
    T = bs * n
    gen = torch.Generator().manual_seed(int(torch.seed() % 2**31))
    static = dict(
        q=torch.empty(T, H, d_qk, dtype=torch.bfloat16, device="cuda"),
        k_draft=torch.empty(T, 1, d_qk, dtype=torch.bfloat16, device="cuda"),
        v_draft=torch.empty(T, 1, d_v, dtype=torch.bfloat16, device="cuda"),
        out=torch.empty(T, H, d_v, dtype=torch.bfloat16, device="cuda"),
        qo=torch.empty(bs + 1, dtype=torch.int32, device="cuda"),
        kv=torch.empty(bs + 1, dtype=torch.int32, device="cuda"),
        kv_indices=torch.empty(bs * max_prefix, dtype=torch.int64, device="cuda"),
        mask=torch.empty(bs * n * (max_prefix + n), dtype=torch.bool, device="cuda"),
        mask_indptr=torch.empty(bs + 1, dtype=torch.int64, device="cuda"),
    )
    k_cache = torch.randn(pool, 1, d_qk, generator=gen).to(torch.bfloat16).cuda()

    def fill(prefix_lens):
        qo = torch.arange(bs + 1, dtype=torch.int32) * n
        kv = torch.zeros(bs + 1, dtype=torch.int32)
        kv[1:] = torch.cumsum(torch.tensor(prefix_lens), 0)
        vis = masks.parents_to_visibility(masks.random_parents([n] * bs, gen), qo, n)
        flat, mask_indptr = masks.visibility_to_sglang_flat(vis, qo, kv)
        slots = torch.randperm(pool, generator=gen)[: int(kv[-1])]
        static["q"].copy_(torch.randn(T, H, d_qk, generator=gen).to(torch.bfloat16))
        static["k_draft"].copy_(torch.randn(T, 1, d_qk, generator=gen).to(torch.bfloat16))
        static["v_draft"].copy_(torch.randn(T, 1, d_v, generator=gen).to(torch.bfloat16))
        static["qo"].copy_(qo)
        static["kv"].copy_(kv)
        static["kv_indices"][: slots.numel()].copy_(slots)
        static["mask"][: flat.numel()].copy_(flat)
        static["mask_indptr"].copy_(mask_indptr)
        static["out"].fill_(float("nan"))
        return vis

    def call():
        return sglang_verify_fwd(
            static["q"], static["k_draft"], static["v_draft"], static["out"], k_cache, k_cache[..., :d_v],
            static["qo"], static["kv"], static["kv_indices"], static["mask"], True, static["mask_indptr"], n,
            1.0, 1.0, 1 / 16, target=TARGET,
        )

    plan = plan_verify(bs, H, n, T, TARGET)
    reserve_workspace([plan], "cuda")
    fill([max_prefix] * bs)
    assert call()  # warm-up compiles outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    for prefix_lens in ([max_prefix, 1, 12_345], [0, 49_999, 777], [31, 32, 33]):
        vis = fill(prefix_lens)
        graph.replay()
        torch.cuda.synchronize()
        ref, _ = reference.tree_verify_reference(
            static["q"], k_cache, k_cache[..., :d_v], static["kv"], static["kv_indices"], static["k_draft"],
            static["v_draft"], static["qo"], vis, 1 / 16, d_v=d_v,
        )
        got = static["out"].double().cpu()
        assert torch.isfinite(got).all(), f"unwritten rows after replay with prefixes {prefix_lens}"
        err = ((got - ref).norm() / ref.norm()).item()
        assert err < 1e-2, f"replay with prefixes {prefix_lens}: relative error {err:.3e}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=["bf16", "e4m3"])
def test_mma_gemm_ceiling_kernel_computes_the_product(dtype):
    """bench's mma.sync ceiling GEMM (ddtree_tools/mma_gemm.py) multiplies correctly, on the instruction it names:
    m16n8k32 e4m3 for 8-bit operands (what sm_120 runs natively), m16n8k16 bf16 for 16-bit."""
    if not TARGET.compiled_gluon:
        pytest.skip("mma_gemm is Gluon: it needs a Triton in gluon_shared.TESTED_TRITON")
    from ddtree_tools.fit import mma_forms
    from ddtree_tools.mma_gemm import mma_gemm

    a = torch.randn(256, 512, device="cuda").to(dtype)
    b = torch.randn(384, 512, device="cuda").to(dtype)
    c, compiled = mma_gemm(a, b)
    ref = a.double() @ b.double().T
    assert ((c.double() - ref).norm() / ref.norm()).item() < 1e-2
    form = "m16n8k32.f32.e4m3.e4m3.f32" if dtype == torch.float8_e4m3fn else "m16n8k16.f32.bf16.bf16.f32"
    assert mma_forms(compiled.asm["ptx"]) == [form]
    with pytest.raises(ValueError, match="multiples of 128"):
        mma_gemm(a[:100], b)
