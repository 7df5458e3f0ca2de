"""sm_120's fp8 latent-split tile on the e4m3 mma.sync (m16n8k32): the cache's bytes are multiplied as they are.

`prefix_latent_split_fp8_kernel` widens each 8-bit key tile to fp16 through registers and multiplies in
fp16. Here the key tile is cp.async'd into shared memory as it lies in the pool (half the bytes of a 16-bit
stage) and both products run on e4m3 operands with fp32 accumulation, half the MMAs of the fp16 path:

- Scores: the queries are quantised in the kernel, one scale a (row, slice half), multiplied back into the
  partial scores, in two e4m3 passes (`Q_PASSES`): their rounding and its residual, into the same chain.
  The rope (16 columns a slice, less than the MMA's k of 32) is widened to fp16 and multiplied in fp16.
- Values: P x 256 in e4m3 (the scale is taken out of the output's). An 8-bit operand is k-contiguous in
  registers, and P . V's k is the keys, so V's bytes (contiguous along the value columns in the pool) are
  transposed: read as 32-bit words (4 columns of a key) and permuted in registers into 4 keys of a column
  (`_values`), with the accumulator's columns in a matching order until the store (`_value_order`).

Measured (BENCHMARKS.md, "fp8 on the e4m3 MMA"): 3e-3 from the float64 reference on GLM-5's shapes (one query
pass: 2.5e-2; P in one pass costs little), against 1.7e-3 for the widening tile and 3.0e-2 for SGLang's fp8
path. On sm_90 ptxas rewrites each e4m3 mma.sync into fp16 conversions and two fp16 MMAs, so the H200 cannot
time it as sm_120 runs it. Only the opt-in table sm120/rules.SM120_E4M3 selects it, to be measured on sm_89+
(`python -m ddtree_tools.bench --table sm120-e4m3`).

Same program structure, grid, partial outputs and LSEs as `prefix_latent_split_kernel`: 8 warps as SLICES x 2,
each owning a quarter of the latent, its queries in registers, the slices' partial scores summed through
shared memory.
"""

from __future__ import annotations

from ..gluon_shared import _GLUON_ERROR

if not _GLUON_ERROR:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

    from ..gluon_shared import _cta_barrier, _grid_dependency, _prologue
    from .prefix_latent_split import (
        SLICES,
        _empty_split,
        _gather,
        _online_state,
        _queries,
        _slots,
        _softmax_step,
        _store_partial,
    )

    E4M3_MAX = gl.constexpr(448.0)
    P_SCALE = gl.constexpr(256.0)  # P in [0, 1] stored x 256: e4m3's normal range down to 2**-14 of the row max

if not _GLUON_ERROR:

    @gluon.jit
    def _e4m3_parts(x):
        """x (fp32, within e4m3's range) as two e4m3 tensors that sum to it within ~2**-8 of its magnitude: x
        rounded to 3 mantissa bits (to nearest even, on its fp32 bits) and what that rounding left. (Rounding by
        `x.to(float8e4nv).to(float32)` instead gives wrong values on Triton 3.6 when both stay in registers.)"""
        bits = x.to(gl.int32, bitcast=True)
        hi = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576).to(gl.float32, bitcast=True)
        return hi.to(gl.float8e4nv), (x - hi).to(gl.float8e4nv)

    @gluon.jit
    def _quantised(x, A_OP: gl.constexpr, SC: gl.constexpr):
        """x ([SLICES, rows, k], fp32) as e4m3 operands scaled to e4m3's range a (slice, row): its rounding, the
        rounding's residual (_e4m3_parts), and the scales."""
        amax = gl.max(gl.abs(x), 2)
        scale = gl.where(amax > 0.0, amax * (1.0 / E4M3_MAX), 1.0)
        hi, lo = _e4m3_parts(x / gl.expand_dims(scale, 2))
        return gl.convert_layout(hi, A_OP), gl.convert_layout(lo, A_OP), gl.convert_layout(scale, SC)

    @gluon.jit
    def _half_scores(q, q_lo, keys, s_zero, B8: gl.constexpr, Q_PASSES: gl.constexpr):
        """One e4m3 score chain: the queries' rounding, then (two passes) its residual, on the same key operand."""
        k = keys.permute((0, 2, 1)).load(B8)
        s = mma_v2(q, k, s_zero)
        if Q_PASSES == 2:
            s = mma_v2(q_lo, k, s)
        return s

    @gluon.jit
    def _scores_e4m3(q0, q0_lo, sc0, q1, q1_lo, sc1, qr, keys, rope, s_zero, s_buf, HALF: gl.constexpr,
                     B8: gl.constexpr, B16: gl.constexpr, Q_PASSES: gl.constexpr):
        """The slices' partial scores of one key tile (two e4m3 chains, each rescaled by its queries' scale,
        and the fp16 rope chain), stored for the sum."""
        s0 = _half_scores(q0, q0_lo, keys.slice(0, HALF, dim=2), s_zero, B8, Q_PASSES)
        s1 = _half_scores(q1, q1_lo, keys.slice(HALF, HALF, dim=2), s_zero, B8, Q_PASSES)
        s_r = mma_v2(qr, rope.permute((0, 2, 1)).load(B16).to(gl.float16), s_zero)
        s_buf.store(s0 * gl.expand_dims(sc0, 2) + s1 * gl.expand_dims(sc1, 2) + s_r)

    @gluon.jit
    def _values(keys, V_WORDS: gl.constexpr, B8: gl.constexpr):
        """P . V's right operand from the key tile, columns in the order n = 64 d6 + 16 (d % 4) + 8 d5 + (d // 4 % 8)
        for value column d: so each thread's bytes of four n-tiles are one 32-bit word of a key row, loaded whole
        (V_WORDS) and transposed in registers, instead of a byte at a time."""
        v = keys.load(V_WORDS)
        S: gl.constexpr = v.shape[0]
        K: gl.constexpr = v.shape[1]
        v = gl.reshape(gl.permute(gl.reshape(v, [S, K, 2, 2, 8, 4]), (0, 1, 2, 5, 3, 4)), [S, K, 128])
        return gl.convert_layout(v, B8)

    @gluon.jit
    def _value_order(acc, MMA: gl.constexpr):
        """The accumulator's columns back in value order (the inverse of _values' order)."""
        S: gl.constexpr = acc.shape[0]
        M: gl.constexpr = acc.shape[1]
        acc = gl.reshape(gl.permute(gl.reshape(acc, [S, M, 2, 4, 2, 8]), (0, 1, 2, 4, 5, 3)), [S, M, 128])
        return gl.convert_layout(acc, MMA)

    @gluon.jit
    def _attend_e4m3(Q, K_buf, kv_indices, O_part, LSE_part, qk_scale, out_scale,
                     q_start, row_end, kv_base, lo, hi, first_row, split,
                     stride_qt, stride_qh, stride_ks, stride_or, stride_op, stride_lr,
                     H: gl.constexpr, D_V: gl.constexpr, D_R: gl.constexpr,
                     BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, WARPS: gl.constexpr, Q_PASSES: gl.constexpr):
        """Rows first_row .. first_row + BLOCK_M against keys lo .. hi of an fp8 cache, each key tile cp.async'd
        as it lies in the pool into the stage the MMAs do not read: this split's partial output."""
        NW: gl.constexpr = D_V // SLICES
        RW: gl.constexpr = D_R // SLICES
        HALF: gl.constexpr = NW // 2
        PARTS: gl.constexpr = WARPS // SLICES
        MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[SLICES, 1, PARTS],
                                                      instr_shape=[1, 16, 8])
        A8: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=4)
        B8: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=4)
        A16: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
        B16: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
        SC: gl.constexpr = gl.SliceLayout(2, MMA)
        fp8: gl.constexpr = K_buf.dtype.element_ty
        # 16-byte cp.async vectors: a slice's 128 values across 8 threads; the rope 8 bytes a thread.
        G_NOPE: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 1, 16], threads_per_warp=[1, 512 // NW, NW // 16],
                                                warps_per_cta=[SLICES, PARTS, 1], order=[2, 1, 0])
        G_ROPE: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 1, 8], threads_per_warp=[1, 32 * 8 // RW, RW // 8],
                                                warps_per_cta=[SLICES, PARTS, 1], order=[2, 1, 0])
        QL: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 1, 8], threads_per_warp=[1, 32 * 8 // HALF, HALF // 8],
                                            warps_per_cta=[SLICES, PARTS, 1], order=[2, 1, 0])
        ROWS_W: gl.constexpr = BLOCK_M // WARPS
        RED: gl.constexpr = gl.BlockedLayout(size_per_thread=[SLICES, 1, BLOCK_N * ROWS_W // 32],
                                             threads_per_warp=[1, ROWS_W, 32 // ROWS_W],
                                             warps_per_cta=[1, WARPS, 1], order=[2, 1, 0])
        S2: gl.constexpr = gl.SliceLayout(0, RED)
        ROWS: gl.constexpr = gl.SliceLayout(1, S2)
        O_ROWS: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(2, MMA))
        # V as 32-bit words: registers hold 4 columns x 4 keys (and keys + 16, columns + 64); lanes keys 4..12 and
        # 8 words; warps the slice and 32-column halves (as the accumulator's warps, MMA's warp order).
        V_WORDS: gl.constexpr = gl.DistributedLinearLayout(
            reg_bases=[[0, 0, 1], [0, 0, 2], [0, 1, 0], [0, 2, 0], [0, 16, 0], [0, 0, 64]],
            lane_bases=[[0, 4, 0], [0, 8, 0], [0, 0, 4], [0, 0, 8], [0, 0, 16]],
            warp_bases=[[0, 0, 32], [1, 0, 0], [2, 0, 0]], block_bases=[], shape=[SLICES, BLOCK_N, NW])

        q0, q0_lo, sc0 = _quantised(_queries(Q, q_start, first_row, row_end, stride_qt, stride_qh, 0, NW, HALF,
                                             BLOCK_M, H, QL).to(gl.float32), A8, SC)
        q1, q1_lo, sc1 = _quantised(_queries(Q, q_start, first_row, row_end, stride_qt, stride_qh, HALF, NW, HALF,
                                             BLOCK_M, H, QL).to(gl.float32), A8, SC)
        qr = gl.convert_layout(_queries(Q, q_start, first_row, row_end, stride_qt, stride_qh, D_V, RW, RW, BLOCK_M,
                                        H, G_ROPE).to(gl.float16), A16)

        nope_stages = gl.allocate_shared_memory(fp8, [2, SLICES, BLOCK_N, NW],
                                                gl.SwizzledSharedLayout(16, 1, 8, order=[2, 1, 0]))
        rope_stages = gl.allocate_shared_memory(fp8, [2, SLICES, BLOCK_N, RW],
                                                gl.SwizzledSharedLayout(1, 1, 1, order=[2, 1, 0]))
        s_buf = gl.allocate_shared_memory(gl.float32, [SLICES, BLOCK_M, BLOCK_N],
                                          gl.SwizzledSharedLayout(8, 1, BLOCK_N // 8, order=[2, 1, 0]))
        p_buf = gl.allocate_shared_memory(fp8, [1, BLOCK_M, BLOCK_N],
                                          gl.SwizzledSharedLayout(16, 1, 2, order=[2, 1, 0]))
        alpha_buf = gl.allocate_shared_memory(gl.float32, [BLOCK_M], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))

        slot, slot_r = _slots(kv_indices, kv_base, lo, hi, BLOCK_N, G_NOPE, G_ROPE)
        _gather(nope_stages.index(0), rope_stages.index(0), K_buf, slot, slot_r, lo, hi, stride_ks, D_V, D_R,
                BLOCK_N, G_NOPE, G_ROPE)
        slot, slot_r = _slots(kv_indices, kv_base, lo + BLOCK_N, hi, BLOCK_N, G_NOPE, G_ROPE)
        acc, s_zero, p_bcast, m_i, l_i, offs_key = _online_state(fp8, NW, BLOCK_M, BLOCK_N, MMA, A8, ROWS, S2)

        n_tiles = gl.cdiv(hi - lo, BLOCK_N)
        for i in range(n_tiles):
            stage = i % 2
            start = lo + i * BLOCK_N
            async_copy.wait_group(0)
            _cta_barrier()
            _gather(nope_stages.index(1 - stage), rope_stages.index(1 - stage), K_buf, slot, slot_r,
                    start + BLOCK_N, hi, stride_ks, D_V, D_R, BLOCK_N, G_NOPE, G_ROPE)
            slot, slot_r = _slots(kv_indices, kv_base, start + 2 * BLOCK_N, hi, BLOCK_N, G_NOPE, G_ROPE)
            keys = nope_stages.index(stage)
            _scores_e4m3(q0, q0_lo, sc0, q1, q1_lo, sc1, qr, keys, rope_stages.index(stage), s_zero, s_buf, HALF,
                         B8, B16, Q_PASSES)
            _cta_barrier()
            m_i, l_i = _softmax_step(s_buf, p_buf, alpha_buf, m_i, l_i, start, hi, offs_key, qk_scale, fp8, RED,
                                     P_SCALE)
            _cta_barrier()
            acc = acc * gl.expand_dims(gl.expand_dims(alpha_buf.load(O_ROWS), 0), 2)
            p_op, _ = gl.broadcast(p_buf.load(A8), p_bcast)
            acc = mma_v2(p_op, _values(keys, V_WORDS, B8), acc)
        async_copy.wait_group(0)
        acc = _value_order(acc, MMA)
        _store_partial(O_part, LSE_part, acc, m_i, l_i, out_scale * (1.0 / P_SCALE), q_start, first_row, row_end,
                       split, stride_or, stride_op, stride_lr, H, D_V, BLOCK_M, MMA, ROWS, O_ROWS)

    @gluon.jit
    def prefix_latent_split_e4m3_kernel(
        Q, K_buf, kv_indices, qo_indptr, kv_indptr,
        O_part, LSE_part,
        k_scale, v_scale, qk_scale_log2, min_chunk, row_base,
        stride_qt, stride_qh, stride_ks,
        stride_or, stride_op, stride_lr,
        H: gl.constexpr, D_V: gl.constexpr, D_R: gl.constexpr,
        BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
        SCALE_FROM_PTR: gl.constexpr, USE_PDL: gl.constexpr, Q_PASSES: gl.constexpr, num_warps: gl.constexpr,
    ):
        """An fp8 e4m3 cache (k_scale, v_scale per tensor), multiplied in e4m3."""
        gl.static_assert((BLOCK_M == 16 or BLOCK_M == 32) and num_warps == 2 * SLICES and BLOCK_N == 32,
                         "16 or 32 rows, 8 warps, 32 keys a tile (the e4m3 MMA's k)")
        gl.static_assert(D_V == 512 and D_R == 64, "GLM-5 / DeepSeek's latent (512 + 64)")
        (split, q_start, n_rows, kv_start, first_row, row_end, lo, hi, qk_scale,
         out_scale) = _prologue(qo_indptr, kv_indptr, min_chunk, 0, 0, row_base, BLOCK_M, k_scale, v_scale,
                                qk_scale_log2, H, BLOCK_N, SCALE_FROM_PTR, USE_PDL)
        if first_row < n_rows:
            if lo >= hi:
                _empty_split(LSE_part, q_start, first_row, row_end, split, stride_lr, H, BLOCK_M, num_warps)
            else:
                _attend_e4m3(Q, K_buf, kv_indices, O_part, LSE_part, qk_scale, out_scale, q_start, row_end,
                             kv_start, lo, hi, first_row, split, stride_qt, stride_qh, stride_ks, stride_or,
                             stride_op, stride_lr, H, D_V, D_R, BLOCK_M, BLOCK_N, num_warps, Q_PASSES)
        if USE_PDL:
            _grid_dependency(True)
