"""Log-sum-exp merge of the partial outputs of one verify call.

Each output row (draft token, head) has `num_parts` partial outputs, each already
normalised, with base-2 LSEs; a part that saw no key has LSE = -inf and is skipped
(its output was never written, so it is selected away, not multiplied by zero).
One program per (row, slice of D_V), one pass with a running maximum: the LSE and
output loads of a step do not depend on each other, so they go out together, and
the launcher sizes BLOCK_S to cover every part in one step where registers allow.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def merge_parts_kernel(
    O_part, LSE_part, Out, LSE_out, qo_indptr, batch, num_parts,
    stride_or, stride_op, stride_lr, stride_ot, stride_oh, stride_lse_t,
    H: tl.constexpr, D_V: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
    STORE_LSE: tl.constexpr, USE_PDL: tl.constexpr,
):
    row = tl.program_id(0)
    d_block = tl.program_id(1)
    # Rows past the last request's draft tokens (CUDA-graph padding) hold no parts.
    if row >= tl.load(qo_indptr + batch).to(tl.int32) * H:
        return
    if USE_PDL:
        # Launched while the prefix kernel still runs (programmatic dependent launch): wait
        # for the last prefix launch, which finishes only after the tree kernel and every
        # prefix launch before it (launcher.run_verify).
        gdc_wait()
    lse_row = LSE_part + row.to(tl.int64) * stride_lr
    o_row = O_part + row.to(tl.int64) * stride_or
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = d_block * BLOCK_D + tl.arange(0, BLOCK_D)
    d_ok = offs_d < D_V

    m = tl.full([], float("-inf"), dtype=tl.float32)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    denom = tl.zeros([], dtype=tl.float32)
    for s0 in range(0, num_parts, BLOCK_S):
        s = s0 + offs_s
        s_ok = s < num_parts
        lse = tl.load(lse_row + s, mask=s_ok, other=float("-inf"))
        parts = tl.load(o_row + s[:, None] * stride_op + offs_d[None, :], mask=s_ok[:, None] & d_ok[None, :],
                        other=0.0)
        m_new = tl.maximum(m, tl.max(lse, 0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        rescale = tl.exp2(m - m_safe)
        w = tl.exp2(lse - m_safe)  # 0 for empty parts
        parts = tl.where((lse != float("-inf"))[:, None], parts, 0.0)
        acc = acc * rescale + tl.sum(parts * w[:, None], 0)
        denom = denom * rescale + tl.sum(w, 0)
        m = m_new

    m_safe = tl.where(m == float("-inf"), 0.0, m)
    denom_safe = tl.where(denom > 0.0, denom, 1.0)
    tok = row // H
    head = row % H
    tl.store(Out + tok.to(tl.int64) * stride_ot + head * stride_oh + offs_d,
             (acc / denom_safe).to(Out.dtype.element_ty), mask=d_ok)
    if STORE_LSE:  # noqa: SIM102 (a constexpr test and a runtime one stay separate in Triton)
        if d_block == 0:
            lse_e = tl.where(denom > 0.0, (m_safe + tl.log2(denom_safe)) * LN2, float("-inf"))
            tl.store(LSE_out + tok.to(tl.int64) * stride_lse_t + head, lse_e)
