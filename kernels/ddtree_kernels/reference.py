"""Float64 torch reference for tree-verify attention (the definition the kernels must meet).

For request b, draft token i and head h: the keys are the request's prefix rows
k_cache[kv_indices[kv_indptr[b]:kv_indptr[b+1]]] (dequantised with k_scale) followed
by its draft rows k_draft[qo_indptr[b]:qo_indptr[b+1]]; draft token i sees every
prefix key and draft key j where visibility[i, j]. Values are the first D_V columns
(v_scale on the prefix). out = softmax(sm_scale * q·kᵀ) · v; lse is its natural log
normaliser.
"""

from __future__ import annotations

import torch


def _rows(t: torch.Tensor) -> torch.Tensor:
    """[N, 1, D] or [N, D] -> float64 [N, D] (fp8 read as its value)."""
    return t.reshape(t.shape[0], t.shape[-1]).to(torch.float32).to(torch.float64)


def tree_verify_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    k_draft: torch.Tensor,
    v_draft: torch.Tensor,
    qo_indptr: torch.Tensor,
    visibility: torch.Tensor | None,
    sm_scale: float,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    d_v: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (out [T, H, D_V], lse [T, H]) in float64 on the CPU (computed on q's device).

    `visibility` is bool [T, n_max]: row t (a global draft token) sees local draft
    token j of its own request where True. None means a causal chain (j <= i).
    """
    d_v = d_v or v_draft.shape[-1]
    qo, kvp = qo_indptr.tolist(), kv_indptr.tolist()
    dev = q.device
    idx = kv_indices.long()
    qf = q.to(torch.float64)
    T, H, _ = q.shape
    out = torch.zeros((T, H, d_v), dtype=torch.float64, device=dev)
    lse = torch.full((T, H), float("-inf"), dtype=torch.float64, device=dev)
    for b in range(len(qo) - 1):
        t0, t1, p0, p1 = qo[b], qo[b + 1], kvp[b], kvp[b + 1]
        n = t1 - t0
        if n == 0:
            continue
        slots = idx[p0:p1]
        k = torch.cat([_rows(k_cache[slots]) * k_scale, _rows(k_draft[t0:t1])])
        v = torch.cat([_rows(v_cache[slots])[:, :d_v] * v_scale, _rows(v_draft[t0:t1])[:, :d_v]])
        if visibility is None:
            tree = torch.ones(n, n, dtype=torch.bool, device=dev).tril()
        else:
            tree = visibility[t0:t1, :n].bool().to(dev)
        allowed = torch.cat([torch.ones(n, p1 - p0, dtype=torch.bool, device=dev), tree], dim=1)  # [n, P + n]
        scores = torch.einsum("nhd,kd->nhk", qf[t0:t1], k) * sm_scale
        scores = scores.masked_fill(~allowed[:, None, :], float("-inf"))
        row_lse = torch.logsumexp(scores, dim=-1)
        probs = torch.exp(scores - row_lse[..., None]).nan_to_num(0.0)
        out[t0:t1] = torch.einsum("nhk,kd->nhd", probs, v)
        lse[t0:t1] = row_lse
    return out.cpu(), lse.cpu()
