"""Device helpers shared by the prefix and tree kernels.

Both kernels run the same inner step of FlashAttention-2 (Dao, 2023): score one
key tile for a block of query rows, then fold it into the running state
(acc, l_i, m_i) with the online softmax. Everything is in base 2: the caller
folds log2(e) into the score scale once, so the stored log-sum-exp is base 2 too.
"""

import triton
import triton.language as tl


@triton.jit
def dot_operand(x, like, DOT_FP32: tl.constexpr):
    """Cast `x` to the dtype the tensor cores take (that of `like`).

    Under TRITON_INTERPRET=1 a bf16 `tl.dot` is silently wrong, so the launcher
    sets DOT_FP32 there and every operand goes in as fp32.
    """
    if DOT_FP32:
        return x.to(tl.float32)
    else:
        return x.to(like.dtype)


@triton.jit
def score_tile(q_nope, q_rope, k_nope, k_rope, HAS_ROPE: tl.constexpr, DOT_FP32: tl.constexpr):
    """Raw scores q·kᵀ of a [BLOCK_M] x [BLOCK_N] tile over the latent and rope parts."""
    qk = tl.dot(
        dot_operand(q_nope, q_nope, DOT_FP32),
        tl.trans(dot_operand(k_nope, q_nope, DOT_FP32)),
    )
    if HAS_ROPE:
        qk += tl.dot(
            dot_operand(q_rope, q_rope, DOT_FP32),
            tl.trans(dot_operand(k_rope, q_rope, DOT_FP32)),
        )
    return qk


@triton.jit
def score_tile_keys_major(q_nope, q_rope, k_nope, k_rope, HAS_ROPE: tl.constexpr, DOT_FP32: tl.constexpr):
    """Raw scores as [BLOCK_N] x [BLOCK_M] (k·qᵀ): the key tile is the left operand, untransposed."""
    qk_t = tl.dot(dot_operand(k_nope, q_nope, DOT_FP32), tl.trans(dot_operand(q_nope, q_nope, DOT_FP32)))
    if HAS_ROPE:
        qk_t += tl.dot(dot_operand(k_rope, q_rope, DOT_FP32), tl.trans(dot_operand(q_rope, q_rope, DOT_FP32)))
    return qk_t


@triton.jit
def raise_running_max(m_i, tile_max):
    """(m_new, m_safe, alpha): the running row maximum after a tile, its -inf-safe form to
    subtract, and the factor that rescales the state so far. Rows whose logits so far are all
    -inf keep m_new = -inf; m_safe keeps exp2(-inf - -inf) from turning them into NaN."""
    m_new = tl.maximum(m_i, tile_max)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    return m_new, m_safe, tl.exp2(m_i - m_safe)


@triton.jit
def online_softmax_step_keys_major(acc, l_i, m_i, qk_t, v, like, DOT_FP32: tl.constexpr):
    """online_softmax_step for logits given as [N, M] (score_tile_keys_major)."""
    m_new, m_safe, alpha = raise_running_max(m_i, tl.max(qk_t, 0))
    p_t = tl.exp2(qk_t - m_safe[None, :])
    l_i = l_i * alpha + tl.sum(p_t, 0)
    p = tl.trans(dot_operand(p_t, like, DOT_FP32))
    acc = acc * alpha[:, None] + tl.dot(p, dot_operand(v, like, DOT_FP32))
    return acc, l_i, m_new


@triton.jit
def online_softmax_step(acc, l_i, m_i, qk, v, like, DOT_FP32: tl.constexpr):
    """Fold one tile of base-2 logits `qk` [M, N] and values `v` [N, D] into the state.

    `like` is the query tile: P and V enter the dot in its dtype (fp8 V is widened).
    """
    m_new, m_safe, alpha = raise_running_max(m_i, tl.max(qk, 1))
    p = tl.exp2(qk - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(dot_operand(p, like, DOT_FP32), dot_operand(v, like, DOT_FP32))
    return acc, l_i, m_new


@triton.jit
def store_partial(
    O_part, LSE_part, rows, row_ok, part, acc, l_i, m_i, out_scale,
    stride_or, stride_op, stride_lr, offs_dv, dv_ok,
):
    """Write one part's normalised output and base-2 LSE (-inf where nothing was seen)."""
    seen = l_i > 0.0
    l_safe = tl.where(seen, l_i, 1.0)
    o = acc * (out_scale / l_safe)[:, None]
    lse = tl.where(seen, m_i + tl.log2(l_safe), float("-inf"))
    o_ptrs = O_part + rows.to(tl.int64)[:, None] * stride_or + part * stride_op + offs_dv[None, :]
    tl.store(o_ptrs, o, mask=row_ok[:, None] & dv_ok[None, :])
    tl.store(LSE_part + rows.to(tl.int64) * stride_lr + part, lse, mask=row_ok)
