"""Attention of draft-token rows over the draft tokens of their own request.

The tree block is small (n <= 65 keys) and masked: draft token i sees draft
token j only where the tree says j is i or one of its ancestors. It runs as one
more part next to the prefix chunks (part index `part`), so the merge treats it
like any other chunk. Draft keys and values are the fresh, unquantised rows
(k_extend / v_extend), so no KV scale applies here.

Mask layouts (MASK_MODE):
  0  causal chain: j <= i
  1  SGLang's flat mask: per request a row-major [n, P + n] block starting at
     mask_indptr[req]; tree columns start at P (the prefix columns are not read)
  2  compact: a [T, mask_row_stride] matrix, row = global draft token, column = j
  3  none: every draft token of the request is visible
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

from .tile import online_softmax_step, score_tile, store_partial

MASK_CHAIN = 0
MASK_SGLANG_FLAT = 1
MASK_COMPACT = 2
MASK_FULL = 3


@triton.jit
def tree_block_kernel(
    Q, K_tree, V_tree, qo_indptr, kv_indptr, mask, mask_indptr,
    O_part, LSE_part,
    qk_scale_log2, part, mask_row_stride,
    stride_qt, stride_qh, stride_kt, stride_vt,
    stride_or, stride_op, stride_lr,
    H: tl.constexpr, D_V: tl.constexpr, D_R: tl.constexpr,
    BLOCK_DV: tl.constexpr, BLOCK_DR: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    MASK_MODE: tl.constexpr, DOT_FP32: tl.constexpr, USE_PDL: tl.constexpr,
):
    # The first kernel of a call. With programmatic dependent launch the prefix kernel
    # launches as soon as every program here has started (it reads nothing written here, and
    # ends waiting for this grid), so this short grid runs beside the prefix kernel's first
    # wave instead of between it and the merge.
    if USE_PDL:
        gdc_launch_dependents()
    row_block = tl.program_id(0)
    req = tl.program_id(1)

    q_start = tl.load(qo_indptr + req).to(tl.int32)
    n_tok = tl.load(qo_indptr + req + 1).to(tl.int32) - q_start
    n_rows = n_tok * H
    if row_block * BLOCK_M >= n_rows:
        return

    offs_m = row_block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = offs_m < n_rows
    rows = q_start * H + offs_m
    tok = offs_m // H  # draft token index i within the request
    offs_dv = tl.arange(0, BLOCK_DV)
    offs_dr = tl.arange(0, BLOCK_DR)
    dv_ok = offs_dv < D_V
    dr_ok = offs_dr < D_R

    q_ptrs = Q + (q_start + tok).to(tl.int64) * stride_qt + (offs_m % H) * stride_qh
    q_nope = tl.load(q_ptrs[:, None] + offs_dv[None, :], mask=row_ok[:, None] & dv_ok[None, :], other=0.0)
    q_rope = tl.load(q_ptrs[:, None] + D_V + offs_dr[None, :], mask=row_ok[:, None] & dr_ok[None, :], other=0.0)

    if MASK_MODE == 1:
        prefix_len = tl.load(kv_indptr + req + 1).to(tl.int64) - tl.load(kv_indptr + req).to(tl.int64)
        mask_rows = tl.load(mask_indptr + req).to(tl.int64) + tok.to(tl.int64) * (prefix_len + n_tok) + prefix_len
    else:
        mask_rows = (q_start + tok).to(tl.int64) * mask_row_stride

    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)

    for start in range(0, n_tok, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_ok = offs_n < n_tok
        key_rows = (q_start + offs_n).to(tl.int64)
        k_ptrs = K_tree + key_rows[:, None] * stride_kt
        k_nope = tl.load(k_ptrs + offs_dv[None, :], mask=n_ok[:, None] & dv_ok[None, :], other=0.0)
        k_rope = tl.load(k_ptrs + D_V + offs_dr[None, :], mask=n_ok[:, None] & dr_ok[None, :], other=0.0)
        v = tl.load(V_tree + key_rows[:, None] * stride_vt + offs_dv[None, :],
                    mask=n_ok[:, None] & dv_ok[None, :], other=0.0)

        visible = row_ok[:, None] & n_ok[None, :]
        if MASK_MODE == 0:
            visible = visible & (offs_n[None, :] <= tok[:, None])
        elif MASK_MODE == 1 or MASK_MODE == 2:
            bits = tl.load(mask + mask_rows[:, None] + offs_n[None, :], mask=visible, other=0)
            visible = visible & (bits != 0)

        qk = score_tile(q_nope, q_rope, k_nope, k_rope, D_R > 0, DOT_FP32) * qk_scale_log2
        qk = tl.where(visible, qk, float("-inf"))
        acc, l_i, m_i = online_softmax_step(acc, l_i, m_i, qk, v, q_nope, DOT_FP32)

    store_partial(O_part, LSE_part, rows, row_ok, part, acc, l_i, m_i, 1.0,
                  stride_or, stride_op, stride_lr, offs_dv, dv_ok)
