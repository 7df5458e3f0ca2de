"""Log-sum-exp merge of the partial outputs of one verify call.

Each output row (draft token, head) has `num_parts` partial outputs, each already
normalised, with base-2 LSEs; a part that saw no key has LSE = -inf and is skipped
(its output was never written). One program per (row, slice of D_V): two passes
over the LSEs (max, then weights) and one over the outputs.
"""

import triton
import triton.language as tl

LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def merge_parts_kernel(
    O_part, LSE_part, Out, LSE_out, qo_indptr, batch, num_parts,
    stride_or, stride_op, stride_lr, stride_ot, stride_oh, stride_lse_t,
    H: tl.constexpr, D_V: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
    STORE_LSE: tl.constexpr,
):
    row = tl.program_id(0)
    d_block = tl.program_id(1)
    # Rows past the last request's draft tokens (CUDA-graph padding) hold no parts.
    if row >= tl.load(qo_indptr + batch).to(tl.int32) * H:
        return
    lse_row = LSE_part + row.to(tl.int64) * stride_lr
    offs_s = tl.arange(0, BLOCK_S)

    m_vec = tl.full([BLOCK_S], float("-inf"), dtype=tl.float32)
    for s0 in range(0, num_parts, BLOCK_S):
        lse = tl.load(lse_row + s0 + offs_s, mask=s0 + offs_s < num_parts, other=float("-inf"))
        m_vec = tl.maximum(m_vec, lse)
    m = tl.max(m_vec, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)

    offs_d = d_block * BLOCK_D + tl.arange(0, BLOCK_D)
    d_ok = offs_d < D_V
    o_row = O_part + row.to(tl.int64) * stride_or
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    w_sum = tl.zeros([BLOCK_S], dtype=tl.float32)
    for s0 in range(0, num_parts, BLOCK_S):
        s = s0 + offs_s
        lse = tl.load(lse_row + s, mask=s < num_parts, other=float("-inf"))
        w = tl.exp2(lse - m_safe)
        used = lse != float("-inf")
        parts = tl.load(o_row + s[:, None] * stride_op + offs_d[None, :],
                        mask=used[:, None] & d_ok[None, :], other=0.0)
        acc += tl.sum(parts * w[:, None], 0)
        w_sum += w

    denom = tl.sum(w_sum, 0)
    denom_safe = tl.where(denom > 0.0, denom, 1.0)
    tok = row // H
    head = row % H
    tl.store(Out + tok.to(tl.int64) * stride_ot + head * stride_oh + offs_d,
             (acc / denom_safe).to(Out.dtype.element_ty), mask=d_ok)
    if STORE_LSE:  # noqa: SIM102 (a constexpr test and a runtime one stay separate in Triton)
        if d_block == 0:
            lse_e = tl.where(denom > 0.0, (m_safe + tl.log2(denom_safe)) * LN2, float("-inf"))
            tl.store(LSE_out + tok.to(tl.int64) * stride_lse_t + head, lse_e)
