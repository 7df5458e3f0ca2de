"""Random verify problems (fresh every run) and the check against the float64 reference."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from ddtree_kernels import masks, reference
from ddtree_kernels.target import Target

EMULATE = os.environ.get("DDTREE_EMULATE", "")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# The GPU the suite plans for: this one, or under DDTREE_EMULATE=sm120 (make test-gpu EMULATE=sm120) sm_120's
# plans on this GPU (the conftest sets DISABLE_MMA_V3, so Triton lowers every dot to mma.sync as there).
TARGET = Target.emulating(EMULATE, DEVICE) if EMULATE else Target.detect(DEVICE)


@dataclass
class Case:
    """One verify call's inputs, in both mask layouts, plus what the reference needs."""

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    k_draft: torch.Tensor
    v_draft: torch.Tensor
    qo_indptr: torch.Tensor
    visibility: torch.Tensor | None  # None: causal chain
    custom_mask: torch.Tensor | None
    mask_indptr: torch.Tensor | None
    max_draft: int
    d_v: int
    sm_scale: float
    k_scale: float
    v_scale: float
    seed: int

    def reference(self) -> tuple[torch.Tensor, torch.Tensor]:
        return reference.tree_verify_reference(
            self.q, self.k_cache, self.v_cache, self.kv_indptr, self.kv_indices, self.k_draft, self.v_draft,
            self.qo_indptr, self.visibility, self.sm_scale, self.k_scale, self.v_scale, d_v=self.d_v,
        )


def make_case(
    prefix_lens: list[int],
    draft_lens: list[int],
    heads: int,
    device: str,
    *,
    d_v: int = 512,
    d_rope: int = 64,
    kv_dtype: torch.dtype = torch.bfloat16,
    q_dtype: torch.dtype = torch.bfloat16,  # queries and draft rows (SGLang: the model's dtype)
    tree: str = "random",  # "random" | "chain" (custom_mask None) | "chain_mask" | "full"
    slots: str = "random",  # "random" | "contiguous"
    separate_v: bool = False,
    seed: int | None = None,
) -> Case:
    seed = int(torch.randint(0, 2**31 - 1, (1,)).item()) if seed is None else seed
    gen = torch.Generator().manual_seed(seed)
    bs, T = len(prefix_lens), sum(draft_lens)
    d_qk = d_v + d_rope
    total_prefix = sum(prefix_lens)
    pool = total_prefix + 64 + total_prefix // 3  # spare slots the kernel must never read
    qo = torch.zeros(bs + 1, dtype=torch.int32)
    qo[1:] = torch.cumsum(torch.tensor(draft_lens), 0)
    kv = torch.zeros(bs + 1, dtype=torch.int32)
    kv[1:] = torch.cumsum(torch.tensor(prefix_lens), 0)
    if slots == "random":
        kv_indices = torch.randperm(pool, generator=gen)[:total_prefix]
    else:
        kv_indices = torch.arange(total_prefix) + 7
    kv_indices = torch.cat([kv_indices, torch.full((5,), 10**9)])  # slack past kv_indptr[-1]

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    q = randn(T, heads, d_qk).to(q_dtype)
    k_draft = randn(T, 1, d_qk).to(q_dtype)
    v_draft = randn(T, 1, d_v).to(q_dtype)
    k_scale = v_scale = 1.0
    cache = randn(pool, 1, d_qk)
    if kv_dtype == torch.float8_e4m3fn:
        k_scale, v_scale = 0.37, 0.37  # one latent row holds K and V: one scale for both
        k_cache = (cache / k_scale).to(kv_dtype)
    else:
        k_cache = cache.to(kv_dtype)
    v_cache = k_cache[..., :d_v]  # SGLang's MLA pool: V is a view of K's first columns
    if separate_v:
        v_cache = randn(pool, 1, d_v).to(kv_dtype)
        if kv_dtype == torch.float8_e4m3fn:
            v_cache = (v_cache.float() / v_scale).to(kv_dtype)

    n_max = max(draft_lens) if draft_lens else 1
    if tree == "random":
        parents = masks.random_parents(draft_lens, gen)
        visibility = masks.parents_to_visibility(parents, qo, n_max)
    elif tree in ("chain", "chain_mask"):
        visibility = masks.chain_visibility(qo, n_max)
    elif tree == "full":
        visibility = torch.ones((T, n_max), dtype=torch.bool)
    else:
        raise ValueError(tree)
    custom_mask, mask_indptr = masks.visibility_to_sglang_flat(visibility, qo, kv)

    def dev(t):
        return None if t is None else t.to(device)

    k_dev = dev(k_cache)
    # V stays a view of the device copy of K, as in SGLang's pool (copying the view would make it separate)
    v_dev = dev(v_cache) if separate_v else k_dev[..., :d_v]
    return Case(
        q=dev(q), k_cache=k_dev, v_cache=v_dev, kv_indptr=dev(kv), kv_indices=dev(kv_indices),
        k_draft=dev(k_draft), v_draft=dev(v_draft), qo_indptr=dev(qo),
        visibility=None if tree == "chain" else dev(visibility),
        custom_mask=None if tree in ("chain", "full") else dev(custom_mask),
        mask_indptr=None if tree in ("chain", "full") else dev(mask_indptr),
        max_draft=n_max, d_v=d_v, sm_scale=d_qk**-0.5 if d_qk != 576 else 1 / 16,
        k_scale=k_scale, v_scale=v_scale, seed=seed,
    )


def assert_close(out: torch.Tensor, ref: torch.Tensor, case: Case, *, tol: float = 1e-2, what: str = "out") -> None:
    """Relative Frobenius error under `tol`, every element written (NaN poison gone)."""
    got = out.detach().to(torch.float64).cpu()
    assert torch.isfinite(got).all(), f"{what}: non-finite values (unwritten rows?) seed={case.seed}"
    err = ((got - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    assert err < tol, f"{what}: relative error {err:.3e} >= {tol} seed={case.seed}"
