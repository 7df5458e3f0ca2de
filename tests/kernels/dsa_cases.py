"""Random DSA tree-verify problems (fresh every run): a latent pool and SGLang's page-size-1 index buffer, the
draft tokens' rows and index keys at slots of their own, random trees, fp8 index queries quantised as SGLang's
indexer quantises them."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ddtree_kernels import masks
from ddtree_kernels.dsa import act_quant, dsa_tree_verify_reference, new_index_buffer, write_index_keys


@dataclass
class DSACase:
    q: torch.Tensor
    k_buf: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    qo_indptr: torch.Tensor
    tree_slots: torch.Tensor
    visibility: torch.Tensor
    index_q: torch.Tensor
    index_weights: torch.Tensor
    index_buf: torch.Tensor
    max_context: int
    topk: int
    sm_scale: float
    k_scale: float
    seed: int

    @property
    def args(self) -> tuple:
        return (self.q, self.k_buf, self.kv_indptr, self.kv_indices, self.qo_indptr, self.tree_slots,
                self.visibility, self.index_q, self.index_weights, self.index_buf)

    def reference(self):
        return dsa_tree_verify_reference(*self.args, topk=self.topk, sm_scale=self.sm_scale, k_scale=self.k_scale)


def make_dsa_case(prefix_lens: list[int], draft_lens: list[int], heads: int, device: str, *, topk: int,
                  index_heads: int = 32, kv_dtype: torch.dtype = torch.bfloat16, tree: str = "random",
                  seed: int | None = None) -> DSACase:
    seed = int(torch.randint(0, 2**31 - 1, (1,)).item()) if seed is None else seed
    gen = torch.Generator().manual_seed(seed)
    bs, T = len(prefix_lens), sum(draft_lens)
    total_prefix = sum(prefix_lens)
    pool = total_prefix + T + 64  # spare slots nothing may read
    perm = torch.randperm(pool, generator=gen)
    kv_indices, tree_slots = perm[:total_prefix], perm[total_prefix:total_prefix + T]
    qo = torch.zeros(bs + 1, dtype=torch.int32)
    qo[1:] = torch.cumsum(torch.tensor(draft_lens), 0)
    kv = torch.zeros(bs + 1, dtype=torch.int32)
    kv[1:] = torch.cumsum(torch.tensor(prefix_lens), 0)
    n_max = max(draft_lens)
    if tree == "random":
        visibility = masks.parents_to_visibility(masks.random_parents(draft_lens, gen), qo, n_max)
    else:
        visibility = masks.chain_visibility(qo, n_max)

    cache = torch.randn(pool, 1, 576, generator=gen)
    k_scale = 0.37 if kv_dtype == torch.float8_e4m3fn else 1.0
    k_buf = (cache / k_scale).to(kv_dtype)
    index_buf = new_index_buffer(pool, "cpu")
    write_index_keys(index_buf, torch.arange(pool), torch.randn(pool, 128, generator=gen))
    index_q, q_scale = act_quant(torch.randn(T, index_heads, 128, generator=gen))
    gates = torch.randn(T, index_heads, generator=gen)
    index_weights = (gates * index_heads**-0.5 * q_scale * 128**-0.5).float()  # SGLang's folded head gates
    q = torch.randn(T, heads, 576, generator=gen).to(torch.bfloat16)

    def dev(t):
        return t.to(device)

    return DSACase(q=dev(q), k_buf=dev(k_buf), kv_indptr=dev(kv), kv_indices=dev(kv_indices), qo_indptr=dev(qo),
                   tree_slots=dev(tree_slots), visibility=dev(visibility), index_q=dev(index_q),
                   index_weights=dev(index_weights), index_buf=dev(index_buf), max_context=max(prefix_lens),
                   topk=topk, sm_scale=1 / 16, k_scale=k_scale, seed=seed)
