"""Float64 reference of DSA tree verify: the lightning indexer, the tree-aware top-k, sparse MLA.

What SGLang computes for a DSA model's TARGET_VERIFY (pinned `ddtree-v2` snapshot, python/sglang/srt/):
- `layers/attention/dsa/dsa_indexer.py`, `Indexer._get_topk_paged` (lines 875-1047): per query token t the
  logits over its keys s are DeepGEMM's `fp8_paged_mqa_logits`,
  `logits[t, s] = sum_h weights[t, h] * relu(q_fp8[t, h] . k_fp8[s]) * k_scale[s]`, where `weights` already holds
  `weights_proj(x) * n_heads**-0.5 * q_scale * head_dim**-0.5` (`_get_logits_head_gate`, lines 520-526), q and k
  quantised by `act_quant` (index_keys.py); `metadata.topk_transform(logits, index_topk)` then keeps the
  `index_topk` best keys of the token's causal range (`dsa_backend.py`, `topk_transform`, line 288).
- the sparse MLA attends the selected rows only: `softmax(sm_scale * q . k) v` over them, keys the 576-wide latent
  rows, values their first 512 columns.

For a draft tree a token's causal range is the prefix plus its ancestors and itself (the ancestor-only mask of the
dense verify): those are scored and eligible; the rest of the tree never is. Where fewer than `topk` keys are
visible, all of them are attended.

Ties: keys with equal logits at the top-k boundary are taken in position order (prefix order, then tree order),
lowest first. The kernels take tied keys at the boundary in no fixed order; the two differ only where two keys
score exactly the same logit at the boundary, and then only in which of them is attended. Exact fp32 ties between
different keys are vanishingly rare on real activations, but keys that quantise alike tie within fp8 rounding;
the tests compare the selected sets where the k-th and (k+1)-th logits differ by more than the logits' rounding
(`boundary_gap`), and the outputs always.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .index_keys import INDEX_DIM, read_index_keys


@dataclass
class DSASelection:
    """One token's selection: the key positions (prefix first, then tree index) and slots it attends, and the
    float64 logits of every key it could see, by position (invisible keys -inf)."""

    positions: torch.Tensor  # int64 [k]
    slots: torch.Tensor  # int64 [k]
    logits: torch.Tensor  # float64 [P + n]


def boundary_gap(logits: torch.Tensor, topk: int) -> float:
    """logit(k-th best) - logit((k+1)-th best) among the finite logits (inf where nothing is left out)."""
    finite = logits[torch.isfinite(logits)]
    if finite.numel() <= topk:
        return float("inf")
    best = torch.topk(finite, topk + 1).values
    return float(best[topk - 1] - best[topk])


def index_logits_reference(index_q: torch.Tensor, index_weights: torch.Tensor, keys: torch.Tensor,
                           key_scales: torch.Tensor) -> torch.Tensor:
    """logits [T, N] = sum_h weights[t, h] * relu(q[t, h] . k[n]) * scale[n], in float64 (fp8 inputs exact)."""
    q = index_q.double().cpu()
    k = keys.double().cpu()
    scores = torch.relu(torch.einsum("thd,nd->thn", q, k))
    return torch.einsum("thn,th->tn", scores, index_weights.double().cpu()) * key_scales.double().cpu()[None, :]


def dsa_select_reference(
    kv_indptr: torch.Tensor, kv_indices: torch.Tensor, qo_indptr: torch.Tensor, tree_slots: torch.Tensor,
    visibility: torch.Tensor, index_q: torch.Tensor, index_weights: torch.Tensor, index_buf: torch.Tensor,
    topk: int,
) -> list[DSASelection]:
    """Each tree token's top-`topk` visible keys (ties: lowest position first)."""
    out = []
    kv_indptr, qo_indptr = kv_indptr.cpu().long(), qo_indptr.cpu().long()
    kv_indices, tree_slots, visibility = kv_indices.cpu().long(), tree_slots.cpu().long(), visibility.cpu().bool()
    for b in range(qo_indptr.numel() - 1):
        q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
        slots = torch.cat([kv_indices[int(kv_indptr[b]):int(kv_indptr[b + 1])], tree_slots[q0:q1]])
        prefix = slots.numel() - (q1 - q0)
        keys, scales = read_index_keys(index_buf, slots.to(index_buf.device))
        logits = index_logits_reference(index_q[q0:q1], index_weights[q0:q1], keys, scales)
        for i in range(q1 - q0):
            row = logits[i].clone()
            row[prefix:] = torch.where(visibility[q0 + i, : q1 - q0], row[prefix:], torch.tensor(float("-inf")))
            visible = torch.nonzero(torch.isfinite(row)).flatten()
            # stable sort by -logit: equal logits keep position order
            order = visible[torch.sort(-row[visible], stable=True).indices][:topk]
            positions = torch.sort(order).values
            out.append(DSASelection(positions, slots[positions], row))
    return out


def dsa_tree_verify_reference(
    q: torch.Tensor,  # [T, H, D_V + D_R] absorbed queries
    kv_cache: torch.Tensor,  # [S, 1, D_V + D_R] latent rows (the draft tokens' rows at tree_slots too)
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    qo_indptr: torch.Tensor,
    tree_slots: torch.Tensor,  # [T] where each draft token's latent row and index key are
    visibility: torch.Tensor,  # [T, n_max] bool: token i sees tree token j of its request (ancestors and itself)
    index_q: torch.Tensor,  # [T, HI, 128] float8_e4m3fn
    index_weights: torch.Tensor,  # [T, HI] float32 (head gates with q scale and softmax scale folded in)
    index_buf: torch.Tensor,  # [S, 132] uint8 page-size-1 index buffer
    *,
    topk: int = 2048,
    sm_scale: float,
    d_v: int = 512,
    k_scale: float = 1.0,
) -> tuple[torch.Tensor, list[DSASelection]]:
    """(out [T, H, d_v] float64, each token's selection)."""
    if index_q.shape[-1] != INDEX_DIM:
        raise ValueError(f"index queries are {INDEX_DIM} wide, got {tuple(index_q.shape)}")
    selections = dsa_select_reference(kv_indptr, kv_indices, qo_indptr, tree_slots, visibility, index_q,
                                      index_weights, index_buf, topk)
    cache = kv_cache.reshape(kv_cache.shape[0], -1).double().cpu() * k_scale
    qd = q.double().cpu()
    out = torch.zeros(q.shape[0], q.shape[1], d_v, dtype=torch.float64)
    for t, sel in enumerate(selections):
        if sel.slots.numel() == 0:
            continue
        k = cache[sel.slots]
        p = torch.softmax(sm_scale * qd[t] @ k.T, dim=-1)
        out[t] = p @ k[:, :d_v]
    return out, selections
