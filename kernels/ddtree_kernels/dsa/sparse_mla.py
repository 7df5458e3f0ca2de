"""Sparse MLA over each tree token's selected keys: split-KV partials that `merge.py` combines.

Token t attends only the slots the top-k chose for it (Sel[t, :SelCount[t]], prefix and tree alike: SGLang writes
a draft token's latent row into the pool before its verify, so every selected key is a pool row). Its heads are
the rows of one program (BLOCK_H of them; GLM-5's 8 heads a GPU pad to mma.sync's 16), the selected slots are cut
into splits, and each program runs the online softmax of the dense prefix tile (tile.py) over gathered
576-wide latent rows, values their first D_V columns, and writes a normalised partial and its base-2 LSE.

Budget on sm_120 (DSA_SM120): a 16-key bf16 tile (18 KB), queries 16 x 576 (18 KB), 4 warps: 37 KB (`make fit`),
so two programs share an SM (a 32-key tile, 56 KB, left one an SM and its grid in two waves).
"""

import triton
import triton.language as tl

from ..prefix_general import load_scale
from ..tile import online_softmax_step, score_tile, store_partial


@triton.jit
def dsa_sparse_mla_kernel(
    Q, K_buf, Sel, SelCount, qo_indptr, O_part, LSE_part,
    k_scale, qk_scale_log2, min_chunk,
    stride_qt, stride_qh, stride_ks, stride_selt, stride_or, stride_op, stride_lr,
    H: tl.constexpr, D_V: tl.constexpr, D_R: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    HEAD_BLOCKS: tl.constexpr, WIDEN: tl.constexpr, SCALE_FROM_PTR: tl.constexpr, DOT_FP32: tl.constexpr,
):
    th = tl.program_id(0)
    split = tl.program_id(1)
    req = tl.program_id(2)
    i = th // HEAD_BLOCKS
    hb = th % HEAD_BLOCKS
    q_start = tl.load(qo_indptr + req).to(tl.int32)
    if i >= tl.load(qo_indptr + req + 1).to(tl.int32) - q_start:
        return
    token = q_start + i
    count = tl.load(SelCount + token)
    chunk = tl.maximum(tl.cdiv(count, tl.num_programs(1)), min_chunk)
    chunk = tl.cdiv(chunk, BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, count)

    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    head_ok = heads < H
    rows = token * H + heads
    offs_dv = tl.arange(0, D_V)
    offs_dr = D_V + tl.arange(0, D_R)
    q_rows = Q + token.to(tl.int64) * stride_qt + heads[:, None] * stride_qh
    q_nope = tl.load(q_rows + offs_dv[None, :], mask=head_ok[:, None], other=0.0)
    q_rope = tl.load(q_rows + offs_dr[None, :], mask=head_ok[:, None], other=0.0)
    ks = load_scale(k_scale, SCALE_FROM_PTR)
    scale = qk_scale_log2 * ks

    acc = tl.zeros([BLOCK_H, D_V], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    sel = Sel + token.to(tl.int64) * stride_selt
    offs_n = tl.arange(0, BLOCK_N)
    slots = tl.load(sel + lo + offs_n, mask=lo + offs_n < hi, other=0).to(tl.int64)
    for p0 in range(lo, hi, BLOCK_N):
        pos = p0 + offs_n
        ok = pos < hi
        k_rows = K_buf + slots[:, None] * stride_ks
        k_nope = tl.load(k_rows + offs_dv[None, :], mask=ok[:, None], other=0.0)
        k_rope = tl.load(k_rows + offs_dr[None, :], mask=ok[:, None], other=0.0)
        # the next tile's slots now: its gather then waits on no index load
        slots = tl.load(sel + pos + BLOCK_N, mask=pos + BLOCK_N < hi, other=0).to(tl.int64)
        if WIDEN:  # an fp8 cache: widen in registers (the dense fp8 path's choice)
            k_nope = k_nope.to(q_nope.dtype)
            k_rope = k_rope.to(q_nope.dtype)
        qk = score_tile(q_nope, q_rope, k_nope, k_rope, True, DOT_FP32) * scale
        qk = tl.where(ok[None, :], qk, float("-inf"))
        acc, l_i, m_i = online_softmax_step(acc, l_i, m_i, qk, k_nope, q_nope, DOT_FP32)
    # values are the keys' first D_V columns: their scale is the keys'
    store_partial(O_part, LSE_part, rows, head_ok, split, acc, l_i, m_i, ks,
                  stride_or, stride_op, stride_lr, offs_dv, offs_dv < D_V)
