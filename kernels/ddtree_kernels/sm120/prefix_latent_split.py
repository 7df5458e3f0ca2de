"""sm_120's prefix tiles, written in Gluon on mma.sync: the latent split across warps.

On sm_120 one program fills an SM (a 64-key tile of 576-wide rows is 72 KB of its 99 KB), so
`prefix_chunked_kernel`'s four warps are one a scheduler, and its `tl.dot` tile waits for every
key tile it gathers (one buffer: the next gather starts when the tile is used up) and re-reads
the queries from shared memory each step. Here 8 warps share each key tile, and none of them
repeats another's work:

- The warps form SLICES x PARTS. Warp (b, h) owns a quarter of the latent, value columns
  128b .. 128b + 128 and rope columns 16b .. 16b + 16, for all BLOCK_M rows, whose queries stay in
  its registers for the whole loop. It scores part h of the key tile against them (a partial score,
  as three independent mma.sync chains: two value halves and the rope) and accumulates its
  128 / PARTS of the slice's value columns. Each key fragment a warp loads from shared memory thus
  serves every row: 32 rows read the shared tile once, not once a 16-row group (a quarter less
  shared-memory traffic a key tile).
- The SLICES partial scores are summed through shared memory; the softmax runs on the sum, a few
  rows a warp, and P goes back through shared memory, one copy that every warp reads.
- A 16-bit cache's key tile is gathered by cp.async, chunk-major ([SLICES, BLOCK_N, 128] values and
  [SLICES, BLOCK_N, 16] rope), into two stages: the next tile lands while this one is used. An fp8
  cache's next tile is loaded into registers (half the bytes) and widened to fp16 into the other
  stage at the end of the iteration; the MMAs then run in fp16, as `prefix_general_kernel`'s fp8 tiles.

Two entry points, one a cache dtype: `prefix_latent_split_kernel` (16-bit, cp.async stages) and
`prefix_latent_split_fp8_kernel` (fp8, widened through registers). They share the queries, the score
MMAs, the softmax step, the value MMA and the store (`_scores`, `_softmax_step`, `_accumulate`,
`_store_partial`) and differ only in how a key tile reaches shared memory.

Same grid, partial outputs and LSEs as `prefix_general_kernel` (merge.py combines them), for a
cache whose values are the keys' first D_V = 512 columns, D_R = 64. It runs where
`gluon_shared.unavailable_reason()` is empty (Triton 3.6-3.9); elsewhere, the interpreter included,
the rule after its rule takes its calls (sm120/rules.py).
"""

from __future__ import annotations

from ..gluon_shared import _GLUON_ERROR

if not _GLUON_ERROR:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

    from ..gluon_shared import (
        _async_gather,
        _cta_barrier,
        _grid_dependency,
        _prologue,
        _raise_running_max,
    )

    SLICES = gl.constexpr(4)  # latent slices, one a group of warps


if not _GLUON_ERROR:

    @gluon.jit
    def _slots(kv_indices, kv_base, start, hi, BLOCK_N: gl.constexpr, G_NOPE: gl.constexpr, G_ROPE: gl.constexpr):
        """Cache slots of keys start .. start + BLOCK_N (0 from hi on), in the key layouts of both gathers.
        Loaded a tile before their gather, so that it does not wait on them; int32 while they wait (a pool
        has fewer than 2**31 rows)."""
        offs = start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, gl.SliceLayout(2, G_NOPE)))
        offs_r = start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, gl.SliceLayout(2, G_ROPE)))
        return (gl.load(kv_indices + kv_base + offs, mask=offs < hi, other=0).to(gl.int32),
                gl.load(kv_indices + kv_base + offs_r, mask=offs_r < hi, other=0).to(gl.int32))

    @gluon.jit
    def _tile_ptrs(K_buf, slot, slot_r, start, hi, stride_ks,
                   D_V: gl.constexpr, D_R: gl.constexpr, BLOCK_N: gl.constexpr, G_NOPE: gl.constexpr,
                   G_ROPE: gl.constexpr):
        """Addresses and masks of keys start .. start + BLOCK_N (at `slot`, `slot_r`; masked from hi on),
        chunk-major: [b, n, c] is value column 128b + c of key n, and rope column 16b + c."""
        NW: gl.constexpr = D_V // SLICES
        RW: gl.constexpr = D_R // SLICES
        offs = start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, gl.SliceLayout(2, G_NOPE)))
        b = gl.arange(0, SLICES, layout=gl.SliceLayout(1, gl.SliceLayout(2, G_NOPE)))
        c = gl.arange(0, NW, layout=gl.SliceLayout(0, gl.SliceLayout(1, G_NOPE)))
        row = gl.expand_dims(gl.expand_dims(slot.to(gl.int64) * stride_ks, 0), 2)
        col = gl.expand_dims(gl.expand_dims(b * NW, 1), 2) + gl.expand_dims(gl.expand_dims(c, 0), 1)
        offs_r = start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, gl.SliceLayout(2, G_ROPE)))
        b_r = gl.arange(0, SLICES, layout=gl.SliceLayout(1, gl.SliceLayout(2, G_ROPE)))
        c_r = gl.arange(0, RW, layout=gl.SliceLayout(0, gl.SliceLayout(1, G_ROPE)))
        row_r = gl.expand_dims(gl.expand_dims(slot_r.to(gl.int64) * stride_ks, 0), 2)
        col_r = D_V + gl.expand_dims(gl.expand_dims(b_r * RW, 1), 2) + gl.expand_dims(gl.expand_dims(c_r, 0), 1)
        return (K_buf + row + col, gl.expand_dims(gl.expand_dims(offs < hi, 0), 2),
                K_buf + row_r + col_r, gl.expand_dims(gl.expand_dims(offs_r < hi, 0), 2))

    @gluon.jit
    def _gather(n_dst, r_dst, K_buf, slot, slot_r, start, hi, stride_ks,
                D_V: gl.constexpr, D_R: gl.constexpr, BLOCK_N: gl.constexpr, G_NOPE: gl.constexpr,
                G_ROPE: gl.constexpr):
        """cp.async keys start .. start + BLOCK_N (zeros from hi on) of a 16-bit cache into one stage
        (n_dst values, r_dst rope; _tile_ptrs' order). One commit group."""
        n_ptrs, n_ok, r_ptrs, r_ok = _tile_ptrs(K_buf, slot, slot_r, start, hi, stride_ks, D_V, D_R, BLOCK_N,
                                                G_NOPE, G_ROPE)
        _async_gather(n_dst, n_ptrs, mask=n_ok)
        _async_gather(r_dst, r_ptrs, mask=r_ok)
        async_copy.commit_group()

    @gluon.jit
    def _load_fp8(K_buf, slot, slot_r, start, hi, stride_ks,
                  D_V: gl.constexpr, D_R: gl.constexpr, BLOCK_N: gl.constexpr, G_NOPE: gl.constexpr,
                  G_ROPE: gl.constexpr):
        """Keys start .. start + BLOCK_N (zeros from hi on) of an fp8 cache into registers, still 8-bit
        (_tile_ptrs' order), widened when they are stored at the iteration's end. (ptxas issues these loads
        after the score MMAs; issuing them a whole iteration earlier measured no faster.)"""
        n_ptrs, n_ok, r_ptrs, r_ok = _tile_ptrs(K_buf, slot, slot_r, start, hi, stride_ks, D_V, D_R, BLOCK_N,
                                                G_NOPE, G_ROPE)
        return gl.load(n_ptrs, mask=n_ok, other=0.0), gl.load(r_ptrs, mask=r_ok, other=0.0)

    @gluon.jit
    def _queries(Q, q_start, first_row, row_end, stride_qt, stride_qh, COL0: gl.constexpr, STRIDE: gl.constexpr,
                 NW: gl.constexpr, ROWS: gl.constexpr, H: gl.constexpr, LAYOUT: gl.constexpr):
        """Query rows first_row .. first_row + ROWS (zeros from row_end on) as [SLICES, ROWS, NW]: slice b holds
        columns COL0 + STRIDE b .. COL0 + STRIDE b + NW."""
        b = gl.arange(0, SLICES, layout=gl.SliceLayout(1, gl.SliceLayout(2, LAYOUT)))
        r = first_row + gl.arange(0, ROWS, layout=gl.SliceLayout(0, gl.SliceLayout(2, LAYOUT)))
        c = gl.arange(0, NW, layout=gl.SliceLayout(0, gl.SliceLayout(1, LAYOUT)))
        row = (q_start + r // H).to(gl.int64) * stride_qt + (r % H) * stride_qh
        ptrs = (Q + COL0 + gl.expand_dims(gl.expand_dims(row, 0), 2) + gl.expand_dims(gl.expand_dims(b * STRIDE, 1), 2)
                + gl.expand_dims(gl.expand_dims(c, 0), 1))
        return gl.load(ptrs, mask=gl.expand_dims(gl.expand_dims(r < row_end, 0), 2), other=0.0)

    @gluon.jit
    def _all_queries(Q, q_start, first_row, row_end, stride_qt, stride_qh, dtype: gl.constexpr, H: gl.constexpr,
                     D_V: gl.constexpr, D_R: gl.constexpr, BLOCK_M: gl.constexpr, A_OP: gl.constexpr,
                     G_NOPE: gl.constexpr, G_ROPE: gl.constexpr):
        """The block's queries in MMA operand registers: each slice's values in two halves (two independent score
        chains) and its rope (a third)."""
        NW: gl.constexpr = D_V // SLICES
        RW: gl.constexpr = D_R // SLICES
        HALF: gl.constexpr = NW // 2
        qn_lo = gl.convert_layout(_queries(Q, q_start, first_row, row_end, stride_qt, stride_qh, 0, NW, HALF, BLOCK_M,
                                           H, G_NOPE).to(dtype), A_OP)
        qn_hi = gl.convert_layout(_queries(Q, q_start, first_row, row_end, stride_qt, stride_qh, HALF, NW, HALF,
                                           BLOCK_M, H, G_NOPE).to(dtype), A_OP)
        qr = gl.convert_layout(_queries(Q, q_start, first_row, row_end, stride_qt, stride_qh, D_V, RW, RW, BLOCK_M, H,
                                        G_ROPE).to(dtype), A_OP)
        return qn_lo, qn_hi, qr

    @gluon.jit
    def _scores(qn_lo, qn_hi, qr, keys, rope, s_zero, s_buf, HALF: gl.constexpr, B_OP: gl.constexpr):
        """The slices' partial scores of one key tile (three mma.sync chains), stored for the sum."""
        s = mma_v2(qn_lo, keys.slice(0, HALF, dim=2).permute((0, 2, 1)).load(B_OP), s_zero)
        s_hi = mma_v2(qn_hi, keys.slice(HALF, HALF, dim=2).permute((0, 2, 1)).load(B_OP), s_zero)
        s_r = mma_v2(qr, rope.permute((0, 2, 1)).load(B_OP), s_zero)
        s = s + (s_hi + s_r)
        s_buf.store(s)

    @gluon.jit
    def _softmax_step(s_buf, p_buf, alpha_buf, m_i, l_i, start, hi, offs_key, qk_scale, dtype: gl.constexpr,
                      RED: gl.constexpr, P_SCALE: gl.constexpr = 1.0):
        """The summed scores of keys start .. start + BLOCK_N (masked from hi on): the online softmax's new running
        maximum and sum; P (x P_SCALE, in `dtype`) and the rescale of the accumulator go to shared memory for every
        warp."""
        scores = gl.sum(s_buf.load(RED), 0)
        scores = gl.where((start + offs_key < hi)[None, :], scores * qk_scale, float("-inf"))
        m_new, m_safe, alpha = _raise_running_max(m_i, gl.max(scores, 1))
        p = gl.exp2(scores - m_safe[:, None])
        l_i = l_i * alpha + gl.sum(p, 1)
        p_buf.store(gl.expand_dims((p * P_SCALE).to(dtype), 0))
        alpha_buf.store(alpha)
        return m_new, l_i

    @gluon.jit
    def _accumulate(acc, keys, p_buf, alpha_buf, p_bcast, A_OP: gl.constexpr, B_OP: gl.constexpr,
                    O_ROWS: gl.constexpr):
        """acc * alpha + P . V for this warp's value columns (V: the key tile's first D_V columns)."""
        acc = acc * gl.expand_dims(gl.expand_dims(alpha_buf.load(O_ROWS), 0), 2)
        p_op, _ = gl.broadcast(p_buf.load(A_OP), p_bcast)
        return mma_v2(p_op, keys.load(B_OP), acc)

    @gluon.jit
    def _online_state(dtype: gl.constexpr, NW: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                      MMA: gl.constexpr, A_OP: gl.constexpr, ROWS: gl.constexpr, S2: gl.constexpr):
        """The loop's starting state: the accumulator, the zero the score chains start from, the shape P's one copy
        is broadcast to (in `dtype`), the running maximum and sum, and the key offsets of a tile."""
        return (gl.zeros([SLICES, BLOCK_M, NW], gl.float32, MMA), gl.zeros([SLICES, BLOCK_M, BLOCK_N], gl.float32, MMA),
                gl.zeros([SLICES, BLOCK_M, BLOCK_N], dtype, A_OP), gl.full([BLOCK_M], float("-inf"), gl.float32, ROWS),
                gl.zeros([BLOCK_M], gl.float32, ROWS), gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S2)))

    @gluon.jit
    def _store_partial(O_part, LSE_part, acc, m_i, l_i, out_scale, q_start, first_row, row_end, split,
                       stride_or, stride_op, stride_lr, H: gl.constexpr, D_V: gl.constexpr, BLOCK_M: gl.constexpr,
                       MMA: gl.constexpr, ROWS: gl.constexpr, O_ROWS: gl.constexpr):
        """This split's normalised partial output and base-2 LSE (-inf where it saw no key)."""
        NW: gl.constexpr = D_V // SLICES
        seen = l_i > 0.0
        l_safe = gl.where(seen, l_i, 1.0)
        offs_m = first_row + gl.arange(0, BLOCK_M, layout=ROWS)
        rows = (q_start * H + offs_m).to(gl.int64)
        gl.store(LSE_part + rows * stride_lr + split, gl.where(seen, m_i + gl.log2(l_safe), float("-inf")),
                 mask=offs_m < row_end)
        norm = gl.convert_layout(out_scale / l_safe, O_ROWS)
        b = gl.arange(0, SLICES, layout=gl.SliceLayout(1, gl.SliceLayout(2, MMA)))
        r = first_row + gl.arange(0, BLOCK_M, layout=O_ROWS)
        c = gl.arange(0, NW, layout=gl.SliceLayout(0, gl.SliceLayout(1, MMA)))
        row_off = (q_start * H + r).to(gl.int64) * stride_or + split * stride_op
        ptrs = (O_part + gl.expand_dims(gl.expand_dims(row_off, 0), 2) + gl.expand_dims(gl.expand_dims(b * NW, 1), 2)
                + gl.expand_dims(gl.expand_dims(c, 0), 1))
        gl.store(ptrs, acc * gl.expand_dims(gl.expand_dims(norm, 0), 2),
                 mask=gl.expand_dims(gl.expand_dims(r < row_end, 0), 2))

    @gluon.jit
    def _buffers(dtype: gl.constexpr, D_V: gl.constexpr, D_R: gl.constexpr, BLOCK_M: gl.constexpr,
                 BLOCK_N: gl.constexpr):
        """The shared memory of a program: two stages of key tiles (values chunk-major, rope), the partial scores
        (each 8-key column block of 8 rows, one mma.sync store, on distinct banks), P (one copy, which every
        slice's warps read) and the accumulator's rescale."""
        nope_stages = gl.allocate_shared_memory(dtype, [2, SLICES, BLOCK_N, D_V // SLICES],
                                                gl.SwizzledSharedLayout(8, 1, 8, order=[2, 1, 0]))
        rope_stages = gl.allocate_shared_memory(dtype, [2, SLICES, BLOCK_N, D_R // SLICES],
                                                gl.SwizzledSharedLayout(8, 4, 2, order=[2, 1, 0]))
        s_buf = gl.allocate_shared_memory(gl.float32, [SLICES, BLOCK_M, BLOCK_N],
                                          gl.SwizzledSharedLayout(8, max(1, 32 // BLOCK_N), BLOCK_N // 8,
                                                                  order=[2, 1, 0]))
        p_buf = gl.allocate_shared_memory(dtype, [1, BLOCK_M, BLOCK_N],
                                          gl.SwizzledSharedLayout(8, 2, 4, order=[2, 1, 0]))
        alpha_buf = gl.allocate_shared_memory(gl.float32, [BLOCK_M], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
        return nope_stages, rope_stages, s_buf, p_buf, alpha_buf

    @gluon.jit
    def _attend_16bit(Q, K_buf, kv_indices, O_part, LSE_part, qk_scale, out_scale,
                      q_start, row_end, kv_base, lo, hi, first_row, split,
                      stride_qt, stride_qh, stride_ks, stride_or, stride_op, stride_lr,
                      H: gl.constexpr, D_V: gl.constexpr, D_R: gl.constexpr,
                      BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, WARPS: gl.constexpr):
        """Rows first_row .. first_row + BLOCK_M (those before row_end) against keys lo .. hi of a 16-bit cache,
        each key tile gathered by cp.async into the stage the MMAs do not read: this split's partial output."""
        NW: gl.constexpr = D_V // SLICES  # value columns a slice
        RW: gl.constexpr = D_R // SLICES  # rope columns a slice
        PARTS: gl.constexpr = WARPS // SLICES  # the key tile's parts (scores), a slice's column parts
        # [slice, rows, keys or columns] on warps [SLICES, 1, PARTS]: warp (b, h) takes slice b, part h and every
        # row (BLOCK_M / 16 mma.sync M steps), so each shared key fragment it loads serves all the rows.
        MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[SLICES, 1, PARTS],
                                                      instr_shape=[1, 16, 8])
        A_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
        B_OP: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
        dtype: gl.constexpr = K_buf.dtype.element_ty
        # 16-byte cp.async vectors: a slice's 128 values across 16 threads; the rope spread over all threads.
        G_NOPE: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 1, 8], threads_per_warp=[1, 256 // NW, NW // 8],
                                                warps_per_cta=[SLICES, WARPS // SLICES, 1], order=[2, 1, 0])
        RV: gl.constexpr = SLICES * BLOCK_N * RW // (32 * WARPS)  # rope values a thread gathers
        G_ROPE: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 1, RV],
                                                threads_per_warp=[1, 32 * RV // RW, RW // RV],
                                                warps_per_cta=[SLICES, WARPS // SLICES, 1], order=[2, 1, 0])
        # The partial scores summed: each thread holds its keys of one row in every slice.
        ROWS_W: gl.constexpr = BLOCK_M // WARPS
        RED: gl.constexpr = gl.BlockedLayout(size_per_thread=[SLICES, 1, BLOCK_N * ROWS_W // 32],
                                             threads_per_warp=[1, ROWS_W, 32 // ROWS_W],
                                             warps_per_cta=[1, WARPS, 1], order=[2, 1, 0])
        S2: gl.constexpr = gl.SliceLayout(0, RED)
        ROWS: gl.constexpr = gl.SliceLayout(1, S2)
        O_ROWS: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(2, MMA))

        # Loaded before the buffers below exist, so that the layout conversion's scratch can share their memory.
        qn_lo, qn_hi, qr = _all_queries(Q, q_start, first_row, row_end, stride_qt, stride_qh, dtype, H, D_V, D_R,
                                        BLOCK_M, A_OP, G_NOPE, G_ROPE)
        nope_stages, rope_stages, s_buf, p_buf, alpha_buf = _buffers(dtype, D_V, D_R, BLOCK_M, BLOCK_N)

        slot, slot_r = _slots(kv_indices, kv_base, lo, hi, BLOCK_N, G_NOPE, G_ROPE)
        _gather(nope_stages.index(0), rope_stages.index(0), K_buf, slot, slot_r, lo, hi, stride_ks, D_V, D_R,
                BLOCK_N, G_NOPE, G_ROPE)
        slot, slot_r = _slots(kv_indices, kv_base, lo + BLOCK_N, hi, BLOCK_N, G_NOPE, G_ROPE)
        acc, s_zero, p_bcast, m_i, l_i, offs_key = _online_state(dtype, NW, BLOCK_M, BLOCK_N, MMA, A_OP, ROWS, S2)

        n_tiles = gl.cdiv(hi - lo, BLOCK_N)
        # A 32-row tile's gather of the next tile waits until its scores are stored: issued at the top, its
        # cp.asyncs queue ahead of the score MMAs' ldmatrix and delay them, while 32 rows' MMAs leave it time to
        # land. A 16-row tile has less to hide the gather behind, so it issues the gather at the top.
        GATHER_LATE: gl.constexpr = BLOCK_M == 32
        for i in range(n_tiles):
            stage = i % 2
            # Tile i has landed (this thread's copies), then everyone's; and every warp is past tile i - 1, whose
            # stage the next tile refills, and past the shared buffers' last reads.
            start = lo + i * BLOCK_N
            async_copy.wait_group(0)
            _cta_barrier()
            if not GATHER_LATE:
                _gather(nope_stages.index(1 - stage), rope_stages.index(1 - stage), K_buf, slot, slot_r,
                        start + BLOCK_N, hi, stride_ks, D_V, D_R, BLOCK_N, G_NOPE, G_ROPE)
                slot, slot_r = _slots(kv_indices, kv_base, start + 2 * BLOCK_N, hi, BLOCK_N, G_NOPE, G_ROPE)
            keys = nope_stages.index(stage)
            _scores(qn_lo, qn_hi, qr, keys, rope_stages.index(stage), s_zero, s_buf, NW // 2, B_OP)
            _cta_barrier()
            if GATHER_LATE:
                _gather(nope_stages.index(1 - stage), rope_stages.index(1 - stage), K_buf, slot, slot_r,
                        start + BLOCK_N, hi, stride_ks, D_V, D_R, BLOCK_N, G_NOPE, G_ROPE)
                slot, slot_r = _slots(kv_indices, kv_base, start + 2 * BLOCK_N, hi, BLOCK_N, G_NOPE, G_ROPE)
            m_i, l_i = _softmax_step(s_buf, p_buf, alpha_buf, m_i, l_i, start, hi, offs_key, qk_scale, dtype, RED)
            _cta_barrier()
            acc = _accumulate(acc, keys, p_buf, alpha_buf, p_bcast, A_OP, B_OP, O_ROWS)
        async_copy.wait_group(0)
        _store_partial(O_part, LSE_part, acc, m_i, l_i, out_scale, q_start, first_row, row_end, split,
                       stride_or, stride_op, stride_lr, H, D_V, BLOCK_M, MMA, ROWS, O_ROWS)

    @gluon.jit
    def _attend_fp8(Q, K_buf, kv_indices, O_part, LSE_part, qk_scale, out_scale,
                    q_start, row_end, kv_base, lo, hi, first_row, split,
                    stride_qt, stride_qh, stride_ks, stride_or, stride_op, stride_lr,
                    H: gl.constexpr, D_V: gl.constexpr, D_R: gl.constexpr,
                    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, WARPS: gl.constexpr):
        """As _attend_16bit for an fp8 cache: the next key tile is loaded into registers (half the bytes) while
        this one is used, and widened to fp16 into the other stage at the iteration's end; the MMAs run in fp16
        (one native convert from e4m3)."""
        NW: gl.constexpr = D_V // SLICES
        RW: gl.constexpr = D_R // SLICES
        PARTS: gl.constexpr = WARPS // SLICES
        MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[SLICES, 1, PARTS],
                                                      instr_shape=[1, 16, 8])
        A_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
        B_OP: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
        dtype: gl.constexpr = gl.float16
        # 16-byte vectors of 8-bit values, a slice's 128 across 8 threads; 4-byte loads of the rope.
        G_NOPE: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 1, 16],
                                                threads_per_warp=[1, 512 // NW, NW // 16],
                                                warps_per_cta=[SLICES, WARPS // SLICES, 1], order=[2, 1, 0])
        G_ROPE: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 1, 4], threads_per_warp=[1, 128 // RW, RW // 4],
                                                warps_per_cta=[SLICES, WARPS // SLICES, 1], order=[2, 1, 0])
        ROWS_W: gl.constexpr = BLOCK_M // WARPS
        RED: gl.constexpr = gl.BlockedLayout(size_per_thread=[SLICES, 1, BLOCK_N * ROWS_W // 32],
                                             threads_per_warp=[1, ROWS_W, 32 // ROWS_W],
                                             warps_per_cta=[1, WARPS, 1], order=[2, 1, 0])
        S2: gl.constexpr = gl.SliceLayout(0, RED)
        ROWS: gl.constexpr = gl.SliceLayout(1, S2)
        O_ROWS: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(2, MMA))

        qn_lo, qn_hi, qr = _all_queries(Q, q_start, first_row, row_end, stride_qt, stride_qh, dtype, H, D_V, D_R,
                                        BLOCK_M, A_OP, G_NOPE, G_ROPE)
        nope_stages, rope_stages, s_buf, p_buf, alpha_buf = _buffers(dtype, D_V, D_R, BLOCK_M, BLOCK_N)

        slot, slot_r = _slots(kv_indices, kv_base, lo, hi, BLOCK_N, G_NOPE, G_ROPE)
        keys8, rope8 = _load_fp8(K_buf, slot, slot_r, lo, hi, stride_ks, D_V, D_R, BLOCK_N, G_NOPE, G_ROPE)
        nope_stages.index(0).store(keys8.to(dtype))
        rope_stages.index(0).store(rope8.to(dtype))
        slot, slot_r = _slots(kv_indices, kv_base, lo + BLOCK_N, hi, BLOCK_N, G_NOPE, G_ROPE)
        acc, s_zero, p_bcast, m_i, l_i, offs_key = _online_state(dtype, NW, BLOCK_M, BLOCK_N, MMA, A_OP, ROWS, S2)

        n_tiles = gl.cdiv(hi - lo, BLOCK_N)
        for i in range(n_tiles):
            stage = i % 2
            # Tile i is stored (this thread's stores), then everyone's; every warp is past tile i - 1.
            start = lo + i * BLOCK_N
            _cta_barrier()
            keys8, rope8 = _load_fp8(K_buf, slot, slot_r, start + BLOCK_N, hi, stride_ks, D_V, D_R, BLOCK_N,
                                     G_NOPE, G_ROPE)
            slot, slot_r = _slots(kv_indices, kv_base, start + 2 * BLOCK_N, hi, BLOCK_N, G_NOPE, G_ROPE)
            keys = nope_stages.index(stage)
            _scores(qn_lo, qn_hi, qr, keys, rope_stages.index(stage), s_zero, s_buf, NW // 2, B_OP)
            _cta_barrier()
            m_i, l_i = _softmax_step(s_buf, p_buf, alpha_buf, m_i, l_i, start, hi, offs_key, qk_scale, dtype, RED)
            _cta_barrier()
            acc = _accumulate(acc, keys, p_buf, alpha_buf, p_bcast, A_OP, B_OP, O_ROWS)
            nope_stages.index(1 - stage).store(keys8.to(dtype))
            rope_stages.index(1 - stage).store(rope8.to(dtype))
        _store_partial(O_part, LSE_part, acc, m_i, l_i, out_scale, q_start, first_row, row_end, split,
                       stride_or, stride_op, stride_lr, H, D_V, BLOCK_M, MMA, ROWS, O_ROWS)

    @gluon.jit
    def _check_tile(BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, D_V: gl.constexpr, D_R: gl.constexpr,
                    WARPS: gl.constexpr):
        gl.static_assert((BLOCK_M == 16 or BLOCK_M == 32) and WARPS % SLICES == 0
                         and BLOCK_N % (8 * (WARPS // SLICES)) == 0,
                         "16 or 32 rows (a warp's queries and accumulator in registers); a warp for each (slice, "
                         "key part of 8+ keys)")
        # 16 keys: 41,536 B and 128 registers at 16 rows, two programs an SM (sm120/rules.py, rule 1).
        gl.static_assert(BLOCK_N == 32 or BLOCK_N == 16, "32 or 16 keys a tile")
        gl.static_assert(D_V % (SLICES * 16) == 0 and D_R % (SLICES * 16) == 0, "whole k-steps a slice")

    @gluon.jit
    def _empty_split(LSE_part, q_start, first_row, row_end, split, stride_lr, H: gl.constexpr,
                     BLOCK_M: gl.constexpr, WARPS: gl.constexpr):
        """A split with no keys: LSE -inf for its rows (the merge gives it no weight)."""
        LSE_LAYOUT: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
        offs = first_row + gl.arange(0, BLOCK_M, layout=LSE_LAYOUT)
        gl.store(LSE_part + (q_start * H + offs).to(gl.int64) * stride_lr + split,
                 gl.full([BLOCK_M], float("-inf"), gl.float32, LSE_LAYOUT), mask=offs < row_end)

    @gluon.jit
    def _program(Q, K_buf, kv_indices, qo_indptr, kv_indptr, O_part, LSE_part, k_scale, v_scale, qk_scale_log2,
                 min_chunk, row_base, stride_qt, stride_qh, stride_ks, stride_or, stride_op, stride_lr,
                 H: gl.constexpr, D_V: gl.constexpr, D_R: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                 SCALE_FROM_PTR: gl.constexpr, USE_PDL: gl.constexpr, FP8: gl.constexpr, WARPS: gl.constexpr):
        """What both entry points do: the PDL handshake, this program's rows and keys, then the cache's attend."""
        _check_tile(BLOCK_M, BLOCK_N, D_V, D_R, WARPS)
        (split, q_start, n_rows, kv_start, first_row, row_end, lo, hi, qk_scale,
         out_scale) = _prologue(qo_indptr, kv_indptr, min_chunk, 0, 0, row_base, BLOCK_M, k_scale, v_scale,
                                qk_scale_log2, H, BLOCK_N, SCALE_FROM_PTR, USE_PDL)
        if first_row < n_rows:
            if lo >= hi:
                _empty_split(LSE_part, q_start, first_row, row_end, split, stride_lr, H, BLOCK_M, WARPS)
            elif FP8:
                _attend_fp8(Q, K_buf, kv_indices, O_part, LSE_part, qk_scale, out_scale, q_start, row_end,
                            kv_start, lo, hi, first_row, split, stride_qt, stride_qh, stride_ks, stride_or,
                            stride_op, stride_lr, H, D_V, D_R, BLOCK_M, BLOCK_N, WARPS)
            else:
                _attend_16bit(Q, K_buf, kv_indices, O_part, LSE_part, qk_scale, out_scale, q_start, row_end,
                              kv_start, lo, hi, first_row, split, stride_qt, stride_qh, stride_ks, stride_or,
                              stride_op, stride_lr, H, D_V, D_R, BLOCK_M, BLOCK_N, WARPS)
        if USE_PDL:
            _grid_dependency(True)

    @gluon.jit
    def prefix_latent_split_kernel(
        Q, K_buf, kv_indices, qo_indptr, kv_indptr,
        O_part, LSE_part,
        k_scale, v_scale, qk_scale_log2, min_chunk, row_base,
        stride_qt, stride_qh, stride_ks,
        stride_or, stride_op, stride_lr,
        H: gl.constexpr, D_V: gl.constexpr, D_R: gl.constexpr,
        BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
        SCALE_FROM_PTR: gl.constexpr, USE_PDL: gl.constexpr, num_warps: gl.constexpr,
    ):
        """A 16-bit cache (bf16 or fp16)."""
        _program(Q, K_buf, kv_indices, qo_indptr, kv_indptr, O_part, LSE_part, k_scale, v_scale, qk_scale_log2,
                 min_chunk, row_base, stride_qt, stride_qh, stride_ks, stride_or, stride_op, stride_lr,
                 H, D_V, D_R, BLOCK_M, BLOCK_N, SCALE_FROM_PTR, USE_PDL, False, num_warps)

    @gluon.jit
    def prefix_latent_split_fp8_kernel(
        Q, K_buf, kv_indices, qo_indptr, kv_indptr,
        O_part, LSE_part,
        k_scale, v_scale, qk_scale_log2, min_chunk, row_base,
        stride_qt, stride_qh, stride_ks,
        stride_or, stride_op, stride_lr,
        H: gl.constexpr, D_V: gl.constexpr, D_R: gl.constexpr,
        BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
        SCALE_FROM_PTR: gl.constexpr, USE_PDL: gl.constexpr, num_warps: gl.constexpr,
    ):
        """An fp8 e4m3 cache (k_scale, v_scale per tensor)."""
        _program(Q, K_buf, kv_indices, qo_indptr, kv_indptr, O_part, LSE_part, k_scale, v_scale, qk_scale_log2,
                 min_chunk, row_base, stride_qt, stride_qh, stride_ks, stride_or, stride_op, stride_lr,
                 H, D_V, D_R, BLOCK_M, BLOCK_N, SCALE_FROM_PTR, USE_PDL, True, num_warps)
