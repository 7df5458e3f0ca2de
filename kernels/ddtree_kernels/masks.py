"""Tree masks in the three shapes the kernels and SGLang use.

- parents: int [T], the local index of each draft token's parent (-1 for a root);
  a parent comes before its child, as DDTree emits them.
- visibility: bool [T, n_max], row = global draft token, column j = local draft
  token j of the same request; True for the token itself and its ancestors.
- SGLang's flat mask: per request a row-major [n, P + n] block at mask_indptr[b],
  prefix columns all True (the verify kernels ignore them).
"""

from __future__ import annotations

import torch


def parents_to_visibility(parents: torch.Tensor, qo_indptr: torch.Tensor, n_max: int) -> torch.Tensor:
    """Ancestor-or-self visibility [T, n_max] from per-request parent arrays."""
    T = parents.shape[0]
    device = parents.device
    starts = torch.repeat_interleave(qo_indptr[:-1].long(), torch.diff(qo_indptr).long())
    if starts.shape[0] != T:
        raise ValueError(f"parents has {T} entries but qo_indptr describes {starts.shape[0]} draft tokens")
    local = torch.arange(T, device=device) - starts
    par = parents.long().to(device)
    if bool(((par >= local) & (par >= 0)).any()):
        raise ValueError("every parent must come before its child (parents[i] < i within a request)")
    vis = torch.zeros((T, n_max), dtype=torch.bool, device=device)
    rows = torch.arange(T, device=device)
    node = local.clone()
    for _ in range(n_max):  # walk up one level per step; depth <= n_max
        alive = node >= 0
        if not bool(alive.any()):
            break
        vis[rows[alive], node[alive]] = True
        node = torch.where(alive, par[starts + node.clamp(min=0)], node)
    return vis


def chain_visibility(qo_indptr: torch.Tensor, n_max: int) -> torch.Tensor:
    """Visibility of a causal chain: draft token i sees j <= i."""
    starts = torch.repeat_interleave(qo_indptr[:-1].long(), torch.diff(qo_indptr).long())
    local = torch.arange(starts.shape[0], device=qo_indptr.device) - starts
    return torch.arange(n_max, device=qo_indptr.device)[None, :] <= local[:, None]


def visibility_to_sglang_flat(
    visibility: torch.Tensor, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's (custom_mask, mask_indptr): per request [n, P + n], prefix columns True."""
    qo, kv = qo_indptr.tolist(), kv_indptr.tolist()
    blocks, lengths = [], []
    for b in range(len(qo) - 1):
        n, p = qo[b + 1] - qo[b], kv[b + 1] - kv[b]
        block = torch.ones((n, p + n), dtype=torch.bool, device=visibility.device)
        block[:, p:] = visibility[qo[b] : qo[b + 1], :n]
        blocks.append(block.flatten())
        lengths.append(n * (p + n))
    mask_indptr = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    mask_indptr[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0)
    flat = torch.cat(blocks) if blocks else torch.zeros(0, dtype=torch.bool, device=visibility.device)
    return flat, mask_indptr.to(visibility.device)


def random_parents(sizes: list[int], generator: torch.Generator | None = None) -> torch.Tensor:
    """Random single-rooted trees, one per request: the parent of token i > 0 is uniform in [0, i)."""
    out = []
    for n in sizes:
        for i in range(n):
            out.append(-1 if i == 0 else int(torch.randint(0, i, (1,), generator=generator)))
    return torch.tensor(out, dtype=torch.int64)
