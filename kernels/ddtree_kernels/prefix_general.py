"""Split-KV attention of draft-token rows over the request's cached prefix.

Flash-decoding (Dao et al., 2023) for MLA verify: the prefix of each request is cut
into `num_splits` contiguous chunks, one program per (row block, chunk, request).
A row is one (draft token, head) pair; all rows of a request share the single
latent KV head, so each gathered KV tile is loaded once for BLOCK_M rows. Keys are
576-wide latent rows at arbitrary slots (page_size 1); values are the first D_V
columns of the same rows, read from the K tile when V is a view of K.

Each program writes a normalised partial output and its base-2 log-sum-exp;
`merge.py` combines the parts. An empty chunk writes LSE = -inf and no output.

A launch covers the rows from `row_base` on, so a plan can give a request's row tail (the rows
past its last whole wide block) a launch of its own on a narrower tile (VerifyPlan.prefix_launches).
On sm_120 these tiles run where the Gluon ones of sm120/prefix_latent_split.py cannot (Triton 3.5, the
interpreter) and for a cache whose values are not in the keys.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .tile import online_softmax_step, online_softmax_step_keys_major, score_tile, score_tile_keys_major, store_partial


@triton.jit
def load_scale(scale, SCALE_FROM_PTR: tl.constexpr):
    """A dequantisation scale passed as a float, or as a 0-dim device tensor (no host sync)."""
    if SCALE_FROM_PTR:
        return tl.load(scale).to(tl.float32)
    else:
        return scale


@triton.jit
def prefetch_to_l2(ptrs):
    """Ask L2 for the lines under `ptrs`; nothing waits for them (PTX prefetch). Returns zeros,
    which the caller must use: an unused result lets the compiler drop the instruction."""
    return tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs],
                              dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def split_bounds(qo_indptr, kv_indptr, req, split, num_splits, min_chunk, H: tl.constexpr, BLOCK_N: tl.constexpr):
    """(q_start, n_rows, kv_start, lo, hi): the request's first draft token, its rows, where its slot
    indices start, and the prefix keys [lo, hi) this split takes (lo >= hi: none). Chunks are equal,
    whole key tiles, at least min_chunk keys, so short prefixes use fewer programs instead of many
    near-empty ones."""
    # All four bounds load before the first branch: one memory round trip, not two.
    q_start = tl.load(qo_indptr + req).to(tl.int32)
    n_rows = (tl.load(qo_indptr + req + 1).to(tl.int32) - q_start) * H
    kv_start = tl.load(kv_indptr + req).to(tl.int64)
    prefix_len = (tl.load(kv_indptr + req + 1).to(tl.int64) - kv_start).to(tl.int32)
    chunk = tl.maximum(tl.cdiv(prefix_len, num_splits), min_chunk)
    chunk = tl.cdiv(chunk, BLOCK_N) * BLOCK_N
    lo = split * chunk
    return q_start, n_rows, kv_start, lo, tl.minimum(lo + chunk, prefix_len)


@triton.jit
def prefetch_slots(slots, lo, hi):
    """Pull slot indices [lo, hi) into L2 (one 128-byte line per 16) before the key loop: the gather of
    every key tile waits on its indices, a dependent load, so each would otherwise be a DRAM trip.
    Returns 0, which the caller adds to something it uses, or the prefetches are dropped."""
    zero = 0
    for p in range(lo, hi, 16 * 256):
        offs_p = p + 16 * tl.arange(0, 256)
        zero += tl.max(prefetch_to_l2(slots + tl.minimum(offs_p, hi - 1)), 0)
    return zero


@triton.jit
def prefix_general_kernel(
    Q, K_buf, V_buf, kv_indices, qo_indptr, kv_indptr,
    O_part, LSE_part,
    k_scale, v_scale, qk_scale_log2, min_chunk, row_base,
    stride_qt, stride_qh, stride_ks, stride_vs,
    stride_or, stride_op, stride_lr,
    H: tl.constexpr, D_V: tl.constexpr, D_R: tl.constexpr,
    BLOCK_DV: tl.constexpr, BLOCK_DR: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    V_FROM_K: tl.constexpr, SCALE_FROM_PTR: tl.constexpr, WIDEN_TO_FP16: tl.constexpr, DOT_FP32: tl.constexpr,
    PREFETCH_L2: tl.constexpr, USE_PDL: tl.constexpr, KEYS_MAJOR: tl.constexpr,
):
    if USE_PDL:
        # Let the kernels after this one launch now and wait on their own (launcher.py):
        # their launch latency and prologue then overlap this grid's tail.
        gdc_launch_dependents()
    row_block = tl.program_id(0)
    split = tl.program_id(1)
    req = tl.program_id(2)
    num_splits = tl.num_programs(1)

    q_start, n_rows, kv_start, lo, hi = split_bounds(qo_indptr, kv_indptr, req, split, num_splits, min_chunk,
                                                     H, BLOCK_N)
    if row_base + row_block * BLOCK_M >= n_rows:
        if USE_PDL:
            gdc_wait()
        return

    offs_m = row_base + row_block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = offs_m < n_rows
    rows = q_start * H + offs_m  # row index into the partial buffers
    if lo >= hi:
        tl.store(LSE_part + rows.to(tl.int64) * stride_lr + split, float("-inf"), mask=row_ok)
        if USE_PDL:
            gdc_wait()
        return

    offs_dv = tl.arange(0, BLOCK_DV)
    offs_dr = tl.arange(0, BLOCK_DR)
    dv_ok = offs_dv < D_V
    dr_ok = offs_dr < D_R
    q_ptrs = Q + (q_start + offs_m // H).to(tl.int64) * stride_qt + (offs_m % H) * stride_qh
    q_nope = tl.load(q_ptrs[:, None] + offs_dv[None, :], mask=row_ok[:, None] & dv_ok[None, :], other=0.0)
    q_rope = tl.load(q_ptrs[:, None] + D_V + offs_dr[None, :], mask=row_ok[:, None] & dr_ok[None, :], other=0.0)
    if WIDEN_TO_FP16:
        # fp8 -> fp16 is one native convert (sm_89+); fp8 -> bf16 takes several. The dots
        # then run in fp16, with fp32 accumulation.
        q_nope = q_nope.to(tl.float16)
        q_rope = q_rope.to(tl.float16)

    qk_scale = qk_scale_log2 * load_scale(k_scale, SCALE_FROM_PTR)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)

    if PREFETCH_L2:
        lo += prefetch_slots(kv_indices + kv_start, lo, hi)

    # Slot indices run one tile ahead of the keys they address. With the index load in the
    # same iteration as its gather, Triton's pipeliner (3.6-3.9) keeps one K buffer and waits
    # for it every iteration; one tile ahead, it double-buffers the gather at 3 stages.
    offs_tile = tl.arange(0, BLOCK_N)
    slot = tl.load(kv_indices + kv_start + lo + offs_tile, mask=lo + offs_tile < hi, other=0).to(tl.int64)
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + offs_tile
        n_ok = offs_n < hi
        offs_next = offs_n + BLOCK_N
        slot_next = tl.load(kv_indices + kv_start + offs_next, mask=offs_next < hi, other=0).to(tl.int64)
        k_ptrs = K_buf + slot[:, None] * stride_ks
        k_nope = tl.load(k_ptrs + offs_dv[None, :], mask=n_ok[:, None] & dv_ok[None, :], other=0.0)
        k_rope = tl.load(k_ptrs + D_V + offs_dr[None, :], mask=n_ok[:, None] & dr_ok[None, :], other=0.0)
        # KEYS_MAJOR (the fp8 tiles): scores as k·qᵀ with the key tile the untransposed left
        # operand, and values gathered on their own. Each 8-bit tile then has one use, and Triton's
        # pipeliner gathers all three asynchronously; shared by two dots, the key tile is loaded
        # synchronously (rules.Tile.keys_major).
        if V_FROM_K and not KEYS_MAJOR:
            v = k_nope
        else:
            v = tl.load(V_buf + slot[:, None] * stride_vs + offs_dv[None, :],
                        mask=n_ok[:, None] & dv_ok[None, :], other=0.0)
        if KEYS_MAJOR:
            qk_t = score_tile_keys_major(q_nope, q_rope, k_nope, k_rope, D_R > 0, DOT_FP32) * qk_scale
            qk_t = tl.where(n_ok[:, None], qk_t, float("-inf"))
            acc, l_i, m_i = online_softmax_step_keys_major(acc, l_i, m_i, qk_t, v, q_nope, DOT_FP32)
        else:
            qk = score_tile(q_nope, q_rope, k_nope, k_rope, D_R > 0, DOT_FP32) * qk_scale
            qk = tl.where(n_ok[None, :], qk, float("-inf"))
            acc, l_i, m_i = online_softmax_step(acc, l_i, m_i, qk, v, q_nope, DOT_FP32)
        slot = slot_next

    store_partial(O_part, LSE_part, rows, row_ok, split, acc, l_i, m_i,
                  load_scale(v_scale, SCALE_FROM_PTR),
                  stride_or, stride_op, stride_lr, offs_dv, dv_ok)
    if USE_PDL:
        # This launch is a programmatic dependent of the launch before it (the tree kernel, or
        # the main prefix launch for the row tail) and reads nothing it writes; ending every
        # program with this wait (here and at the early returns) makes this grid complete only
        # after that one, so the merge, which waits on the last prefix launch, sees every part.
        gdc_wait()
