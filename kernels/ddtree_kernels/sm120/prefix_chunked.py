"""Split-KV prefix attention with the score reduction cut into four independent chunks.

The tile for GPUs without wgmma (sm_120, and Hopper's fallback). In `prefix_general_kernel` each
warp scores its keys with one chain of 36 dependent mma.sync down the 576-wide latent, and with
one program an SM (all that sm_120's 99 KB of shared memory allows) nothing hides that chain's
latency. Here the latent's value part is gathered as four column chunks of D_V / 4: the scores
are four chains of a quarter the length (plus the rope part's), which the compiler interleaves,
and each chunk of values, read from the same tile, has its own accumulator.

Same grid, partial outputs and LSEs as `prefix_general_kernel` (merge.py combines them). A 16-bit
cache whose values are the first D_V columns of the key rows (SGLang's MLA pool), D_V / 4 and
D_R powers of two (registry.chunked_supports); fp8 caches keep prefix_general_kernel's keys-major
tiles, which measured faster.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ..prefix_general import load_scale, prefetch_slots, split_bounds
from ..tile import dot_operand, raise_running_max


@triton.jit
def _score(q, k, DOT_FP32: tl.constexpr):
    return tl.dot(dot_operand(q, q, DOT_FP32), tl.trans(dot_operand(k, q, DOT_FP32)))


@triton.jit
def _accumulate(acc, alpha, p, v, DOT_FP32: tl.constexpr):
    return acc * alpha[:, None] + tl.dot(p, dot_operand(v, p, DOT_FP32))


@triton.jit
def _store_chunk(O_part, rows, row_ok, split, stride_or, stride_op, acc, scale, offs, first: tl.constexpr):
    ptrs = O_part + rows.to(tl.int64)[:, None] * stride_or + split * stride_op + first + offs[None, :]
    tl.store(ptrs, acc * scale[:, None], mask=row_ok[:, None])


@triton.jit
def prefix_chunked_kernel(
    Q, K_buf, kv_indices, qo_indptr, kv_indptr,
    O_part, LSE_part,
    k_scale, v_scale, qk_scale_log2, min_chunk, row_base,
    stride_qt, stride_qh, stride_ks,
    stride_or, stride_op, stride_lr,
    H: tl.constexpr, D_V: tl.constexpr, D_R: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SCALE_FROM_PTR: tl.constexpr, DOT_FP32: tl.constexpr,
    PREFETCH_L2: tl.constexpr, USE_PDL: tl.constexpr,
):
    CW: tl.constexpr = D_V // 4
    if USE_PDL:
        gdc_launch_dependents()  # as in prefix_general_kernel
    row_block = tl.program_id(0)
    split = tl.program_id(1)
    req = tl.program_id(2)

    q_start, n_rows, kv_start, lo, hi = split_bounds(qo_indptr, kv_indptr, req, split, tl.num_programs(1),
                                                     min_chunk, H, BLOCK_N)
    if row_base + row_block * BLOCK_M >= n_rows:
        if USE_PDL:
            gdc_wait()
        return
    offs_m = row_base + row_block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = offs_m < n_rows
    rows = q_start * H + offs_m
    if lo >= hi:
        tl.store(LSE_part + rows.to(tl.int64) * stride_lr + split, float("-inf"), mask=row_ok)
        if USE_PDL:
            gdc_wait()
        return

    offs_c = tl.arange(0, CW)
    offs_r = tl.arange(0, D_R)
    q_ptrs = (Q + (q_start + offs_m // H).to(tl.int64) * stride_qt + (offs_m % H) * stride_qh)[:, None]
    q_ok = row_ok[:, None]
    q0 = tl.load(q_ptrs + offs_c[None, :], mask=q_ok, other=0.0)
    q1 = tl.load(q_ptrs + CW + offs_c[None, :], mask=q_ok, other=0.0)
    q2 = tl.load(q_ptrs + 2 * CW + offs_c[None, :], mask=q_ok, other=0.0)
    q3 = tl.load(q_ptrs + 3 * CW + offs_c[None, :], mask=q_ok, other=0.0)
    qr = tl.load(q_ptrs + D_V + offs_r[None, :], mask=q_ok, other=0.0)

    qk_scale = qk_scale_log2 * load_scale(k_scale, SCALE_FROM_PTR)
    acc0 = tl.zeros([BLOCK_M, CW], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_M, CW], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_M, CW], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_M, CW], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    if PREFETCH_L2:
        lo += prefetch_slots(kv_indices + kv_start, lo, hi)

    # Slot indices one tile ahead of their gather, as prefix_general_kernel. At 2 stages the 64-key tile
    # still has one buffer (all that fits beside the queries), so each gather waits for the tile
    # before it to be used up: the wait prefix_latent_split's two stages remove.
    offs_tile = tl.arange(0, BLOCK_N)
    slot = tl.load(kv_indices + kv_start + lo + offs_tile, mask=lo + offs_tile < hi, other=0).to(tl.int64)
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + offs_tile
        n_ok = offs_n < hi
        slot_next = tl.load(kv_indices + kv_start + offs_n + BLOCK_N, mask=offs_n + BLOCK_N < hi, other=0).to(tl.int64)
        k_ptrs = (K_buf + slot * stride_ks)[:, None]
        k_ok = n_ok[:, None]
        k0 = tl.load(k_ptrs + offs_c[None, :], mask=k_ok, other=0.0)
        k1 = tl.load(k_ptrs + CW + offs_c[None, :], mask=k_ok, other=0.0)
        k2 = tl.load(k_ptrs + 2 * CW + offs_c[None, :], mask=k_ok, other=0.0)
        k3 = tl.load(k_ptrs + 3 * CW + offs_c[None, :], mask=k_ok, other=0.0)
        kr = tl.load(k_ptrs + D_V + offs_r[None, :], mask=k_ok, other=0.0)
        # Five independent MMA chains, summed in a tree.
        qk = (_score(q0, k0, DOT_FP32) + _score(q1, k1, DOT_FP32)) + (_score(q2, k2, DOT_FP32) + _score(
            q3, k3, DOT_FP32)) + _score(qr, kr, DOT_FP32)
        qk = tl.where(n_ok[None, :], qk * qk_scale, float("-inf"))
        m_new, m_safe, alpha = raise_running_max(m_i, tl.max(qk, 1))
        p = tl.exp2(qk - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        p = dot_operand(p, q0, DOT_FP32)
        acc0 = _accumulate(acc0, alpha, p, k0, DOT_FP32)
        acc1 = _accumulate(acc1, alpha, p, k1, DOT_FP32)
        acc2 = _accumulate(acc2, alpha, p, k2, DOT_FP32)
        acc3 = _accumulate(acc3, alpha, p, k3, DOT_FP32)
        m_i = m_new
        slot = slot_next

    seen = l_i > 0.0
    l_safe = tl.where(seen, l_i, 1.0)
    scale = load_scale(v_scale, SCALE_FROM_PTR) / l_safe
    _store_chunk(O_part, rows, row_ok, split, stride_or, stride_op, acc0, scale, offs_c, 0)
    _store_chunk(O_part, rows, row_ok, split, stride_or, stride_op, acc1, scale, offs_c, CW)
    _store_chunk(O_part, rows, row_ok, split, stride_or, stride_op, acc2, scale, offs_c, 2 * CW)
    _store_chunk(O_part, rows, row_ok, split, stride_or, stride_op, acc3, scale, offs_c, 3 * CW)
    tl.store(LSE_part + rows.to(tl.int64) * stride_lr + split, tl.where(seen, m_i + tl.log2(l_safe), float("-inf")),
             mask=row_ok)
    if USE_PDL:
        gdc_wait()  # as in prefix_general_kernel
