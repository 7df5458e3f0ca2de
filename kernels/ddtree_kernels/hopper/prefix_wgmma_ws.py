"""The Gluon wide tile, warp-specialized, for Hopper: one warpgroup scores, two accumulate, one takes the row tail.

In `prefix_wgmma`'s wide tile the 8-row tail (GLM-5: 72 rows = 64 + 8) runs in the same
instruction stream as the 64-row block, after it, on every key tile, and the block's two
warpgroups each score half the keys. Here the work of a key tile is split over three
partitions (`gl.warp_specialize`) that hand the shared key stages over through mbarriers:

- The scorer (the kernel's own 4 warps) scores the 64-row block against all 64 keys of the tile
  (one m64n64 wgmma chain), runs the softmax, writes P into the tile's rope buffer (dead once
  scored) and each row's rescale into `rows_smem` (`p_ready`), and accumulates the first 256
  value columns.
- The value partition (4 warps) gathers the key tiles for everyone and accumulates the other 256
  value columns with the P and rescale the scorer left. A tile's `ready` completes when its
  copies land (cp.async.mbarrier.arrive), not when this partition next gets to its loop head.
- The tail partition (4 warps) scores and accumulates the tail rows keys-major (its rows are
  wgmma's N), in five independent score chains that it adds up, and says when it has read the
  rope buffer (`scored`: the scorer may write P there).
- `done` (all three) frees a stage for the next gather.

Why one scorer: the tile is bound by shared-memory reads (wgmma reads both operands of these
shapes from shared memory; Nsight Compute put L1/TEX at 66% with the tensor pipe at 35%). Two
warpgroups that each score half the keys each read all 64 rows of queries, 147 KB a tile; one that
scores all the keys reads them once, and a row's maxima stay in one warp.

Each partition writes its own part: the scorer its half of the block's columns and the LSEs, the
value partition the other half (normalised with the scorer's factors, `final`), each staged in a
spent key stage so a warp stores whole 512-byte rows; the tail its rows. The merge is unchanged.
Registers (setmaxnreg): the scorer 240 a thread, the value partition 184, the tail 80.

Same grid, arguments and partial outputs as `prefix_wgmma.prefix_wgmma_kernel`, launched with
KERNEL_WARPS warps; a bf16 or fp16 cache whose values are the keys' first D_V columns, D_V = 512,
D_R = 64, BLOCK_M 64 with a row tail (TAIL_N > 0). Triton 3.6-3.9 on an sm_90 GPU, as `prefix_wgmma`.
"""

from __future__ import annotations

from ..gluon_shared import unavailable_reason

# The kernel's own warps, the scorer partition's (num_warps at launch); the worker partitions add 8 more.
KERNEL_WARPS = 4

if not unavailable_reason():
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        async_copy,
        fence_async_shared,
        mbarrier,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    from .prefix_wgmma import (
        _cta_barrier,
        _gather_ahead,
        _gather_tile,
        _grid_dependency,
        _key_stages,
        _keys_major_queries,
        _keys_major_state,
        _load_queries,
        _opaque_zero,
        _prologue,
        _raise_running_max,
        _store_part,
        _tail_softmax,
        _tile_slots,
    )

    # Each worker partition's warps and the registers each of its threads may hold (setmaxnreg); the scorer
    # (the kernel's own warps) gets what the two leave: 240 a thread.
    TAIL_WARPS = gl.constexpr(4)
    TAIL_REGS = gl.constexpr(80)
    VALUE_WARPS = gl.constexpr(4)
    VALUE_REGS = gl.constexpr(184)

    @gluon.jit
    def _store_half_part(stage, O_part, acc, norm, row0, first_row, row_end, split, stride_or, stride_op,
                         COL0: gl.constexpr, BLOCK_M: gl.constexpr, HALF: gl.constexpr, O_LAYOUT: gl.constexpr):
        """One warpgroup's half of the block's part (columns COL0 .. COL0 + HALF), normalised by `norm`
        (v_scale / l per row), staged through `stage` (BLOCK_M x HALF fp32 of free shared memory) so that a
        warp stores whole 512-byte row pieces."""
        staged = stage.reinterpret(gl.float32, [BLOCK_M, HALF],
                                   gl.SwizzledSharedLayout(vec=4, per_phase=1, max_phase=8, order=[1, 0]))
        staged.store(acc * gl.convert_layout(norm, gl.SliceLayout(1, O_LAYOUT))[:, None])
        _cta_barrier()
        ROW_LAYOUT: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 4], threads_per_warp=[1, 32],
                                                    warps_per_cta=[4, 1], order=[1, 0])
        offs_m = first_row + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, ROW_LAYOUT))
        cols = COL0 + gl.arange(0, HALF, layout=gl.SliceLayout(0, ROW_LAYOUT))
        rows = (row0 + offs_m).to(gl.int64)
        gl.store(O_part + (rows * stride_or + split * stride_op)[:, None] + cols[None, :], staged.load(ROW_LAYOUT),
                 mask=(offs_m < row_end)[:, None])

    @gluon.jit
    def _scorer_partition(
        qn_smem, qr_smem, g_nope, g_rope, rows_smem, ready, scored, p_ready, done, final,
        O_part, LSE_part, qk_scale_log2, v_scale,
        row0, row_end, lo, hi, n_tiles, first_row, split,
        stride_or, stride_op, stride_lr,
        D_V: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
    ):
        """The 64-row block's scores on one warpgroup (all BLOCK_N keys: the queries are read once a tile, not
        once per warpgroup), its softmax, P into the tile's rope buffer and the rescale into `rows_smem`, and
        the values of the first half of the columns."""
        HALF: gl.constexpr = D_V // 2
        S_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        O_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, HALF, 16])
        dtype: gl.constexpr = g_nope.dtype
        acc = gl.zeros([BLOCK_M, HALF], gl.float32, O_LAYOUT)
        l_i = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, S_LAYOUT))
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, gl.SliceLayout(1, S_LAYOUT))
        s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, S_LAYOUT)
        offs_sn = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_LAYOUT))
        for i in range(n_tiles):
            stage = i % NUM_STAGES
            phase = (i // NUM_STAGES) & 1
            # The tile's copies have landed; the fence orders them before this warpgroup's wgmma reads.
            mbarrier.wait(ready.index(stage), phase)
            fence_async_shared()
            k_tile = g_nope.index(stage)
            r_tile = g_rope.index(stage)
            z = _opaque_zero()
            s = warpgroup_mma(qn_smem.index(z), k_tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            s = warpgroup_mma(qr_smem.index(z), r_tile.permute((1, 0)), s, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
            s = gl.where((lo + i * BLOCK_N + offs_sn < hi)[None, :], s * qk_scale_log2, float("-inf"))
            m_new, m_safe, alpha = _raise_running_max(m_i, gl.max(s, 1))
            p = gl.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + gl.sum(p, 1)
            m_i = m_new
            # P goes into this stage's rope buffer once the tail has scored it; the rescale beside it.
            _cta_barrier()
            mbarrier.wait(scored.index(stage), phase)
            r_tile.store(p.to(dtype))
            rows_smem.index(stage).store(alpha)
            fence_async_shared()
            _cta_barrier()
            mbarrier.arrive(p_ready.index(stage))
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_LAYOUT))[:, None]
            acc = warpgroup_mma(r_tile, k_tile.slice(0, HALF, dim=1), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            _cta_barrier()
            mbarrier.arrive(done.index(stage))
        seen = l_i > 0.0
        l_safe = gl.where(seen, l_i, 1.0)
        norm = v_scale / l_safe
        offs_l = first_row + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, S_LAYOUT))
        gl.store(LSE_part + (row0 + offs_l).to(gl.int64) * stride_lr + split,
                 gl.where(seen, m_i + gl.log2(l_safe), float("-inf")), mask=offs_l < row_end)
        # Every partition is done with every stage (and the value partition with every rescale).
        last = gl.maximum(n_tiles - 1, 0)
        mbarrier.wait(done.index(last % NUM_STAGES), (last // NUM_STAGES) & 1, pred=n_tiles > 0)
        # The value partition normalises its half with the same factors.
        rows_smem.index(0).store(norm)
        _cta_barrier()
        mbarrier.arrive(final)
        # Staged in the last tile's stage: the value partition's gathers past the chunk (zeros) may still be landing
        # in the others.
        _store_half_part(g_nope.index((n_tiles + NUM_STAGES - 1) % NUM_STAGES), O_part, acc, norm, row0, first_row,
                         row_end, split, stride_or, stride_op, 0, BLOCK_M, HALF, O_LAYOUT)

    @gluon.jit
    def _values_partition(
        g_nope, g_rope, rows_smem, ready, p_ready, done, final,
        K_buf, kv_indices, O_part,
        row0, row_end, kv_base, lo, hi, n_tiles, first_row, split,
        stride_ks, stride_or, stride_op,
        D_V: gl.constexpr, D_R: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
        NUM_STAGES: gl.constexpr,
    ):
        """The key gathers for every partition, and the values of the second half of the columns with the P and
        rescale the scorer leaves in shared memory."""
        HALF: gl.constexpr = D_V // 2
        O_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, HALF, 16])
        NOPE_LAYOUT: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[2, 16],
                                                     warps_per_cta=[4, 1], order=[1, 0])
        ROPE_LAYOUT: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[4, 8],
                                                     warps_per_cta=[4, 1], order=[1, 0])
        AHEAD: gl.constexpr = NUM_STAGES - 1
        slot_n, slot_r = _gather_ahead(g_nope, g_rope, kv_indices, kv_base, K_buf, lo, hi, stride_ks, AHEAD, D_V, D_R,
                                       BLOCK_N, NOPE_LAYOUT, ROPE_LAYOUT)
        # Each thread's arrival on a tile's `ready` (VALUE_WARPS * 32 of them) lands when its copies so far have.
        for t in gl.static_range(AHEAD):
            async_copy.mbarrier_arrive(ready.index(t), increment_count=False)
        acc = gl.zeros([BLOCK_M, HALF], gl.float32, O_LAYOUT)
        for i in range(n_tiles):
            stage = i % NUM_STAGES
            phase = (i // NUM_STAGES) & 1
            # The next gather refills the stage of tile i + AHEAD - NUM_STAGES, once every partition is done with it.
            ahead = lo + (i + AHEAD) * BLOCK_N
            free = (i + AHEAD) % NUM_STAGES
            mbarrier.wait(done.index(free), ((i + AHEAD - NUM_STAGES) // NUM_STAGES) & 1,
                          pred=i + AHEAD >= NUM_STAGES)
            _gather_tile(g_nope.index(free), g_rope.index(free), slot_n, slot_r, K_buf, ahead, hi, stride_ks,
                         D_V, D_R, BLOCK_N, NOPE_LAYOUT, ROPE_LAYOUT)
            async_copy.mbarrier_arrive(ready.index(free), increment_count=False)
            slot_n, slot_r = _tile_slots(kv_indices, kv_base, ahead + BLOCK_N, hi, BLOCK_N, NOPE_LAYOUT, ROPE_LAYOUT)
            mbarrier.wait(p_ready.index(stage), phase)
            alpha = rows_smem.index(stage).load(gl.SliceLayout(1, O_LAYOUT))
            acc = acc * alpha[:, None]
            acc = warpgroup_mma(g_rope.index(stage), g_nope.index(stage).slice(HALF, HALF, dim=1), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            _cta_barrier()
            mbarrier.arrive(done.index(stage))
        async_copy.wait_group(0)
        # `final`: the scorer's factors are in shared memory, and every partition is done with every stage.
        mbarrier.wait(final, 0)
        norm = rows_smem.index(0).load(gl.SliceLayout(1, O_LAYOUT))
        # Staged in the stage after the last tile's (the scorer stages in that one), now that this partition's
        # gathers, those past the chunk too, have all landed.
        _store_half_part(g_nope.index(n_tiles % NUM_STAGES), O_part, acc, norm, row0, first_row, row_end, split,
                         stride_or, stride_op, HALF, BLOCK_M, HALF, O_LAYOUT)

    @gluon.jit
    def _tail_partition(
        tn_smem, tr_smem, pt_smem, g_nope, g_rope, ready, scored, done,
        O_part, LSE_part, qk_scale_log2, v_scale,
        row0, row_end, lo, hi, n_tiles, first_row, split,
        stride_or, stride_op, stride_lr,
        D_V: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
        TAIL_N: gl.constexpr,
    ):
        """The row tail, keys-major (its rows are wgmma's N) on 4 warps, on the tiles the value partition gathers."""
        ST_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[TAIL_WARPS, 1],
                                                            instr_shape=[16, TAIL_N, 16])
        acc_t, lt_acc, m_t, st_zero, offs_tn = _keys_major_state(D_V, BLOCK_N, TAIL_N, ST_LAYOUT)
        for i in range(n_tiles):
            stage = i % NUM_STAGES
            phase = (i // NUM_STAGES) & 1
            # The tile's copies have landed; the fence orders them before this warpgroup's wgmma reads.
            mbarrier.wait(ready.index(stage), phase)
            fence_async_shared()
            k_tile = g_nope.index(stage)
            r_tile = g_rope.index(stage)
            # The scores in independent chains, one per 128 latent columns and one for the rope: the 36
            # k-steps of one m64n8k16 chain each wait for the last, and such a chain is the tail's critical path.
            z = _opaque_zero()
            tq = tn_smem.index(z)
            s0 = warpgroup_mma(k_tile.slice(0, 128, dim=1), tq.slice(0, 128, dim=1).permute((1, 0)), st_zero,
                               use_acc=False, is_async=True)
            s1 = warpgroup_mma(k_tile.slice(128, 128, dim=1), tq.slice(128, 128, dim=1).permute((1, 0)), st_zero,
                               use_acc=False, is_async=True)
            s2 = warpgroup_mma(k_tile.slice(256, 128, dim=1), tq.slice(256, 128, dim=1).permute((1, 0)), st_zero,
                               use_acc=False, is_async=True)
            s3 = warpgroup_mma(k_tile.slice(384, 128, dim=1), tq.slice(384, 128, dim=1).permute((1, 0)), st_zero,
                               use_acc=False, is_async=True)
            s4 = warpgroup_mma(r_tile, tr_smem.index(z).permute((1, 0)), st_zero, use_acc=False, is_async=True)
            s0, s1, s2, s3, s4 = warpgroup_mma_wait(num_outstanding=0, deps=(s0, s1, s2, s3, s4))
            st = (s0 + s1) + (s2 + s3) + s4
            # Every tail warp has read the rope buffer: the block may put its P there.
            _cta_barrier()
            mbarrier.arrive(scored.index(stage))
            m_t, lt_acc, alpha_t = _tail_softmax(st, m_t, lt_acc, pt_smem, qk_scale_log2, lo + i * BLOCK_N, hi, offs_tn)
            fence_async_shared()
            _cta_barrier()
            acc_t = acc_t * alpha_t[None, :]
            acc_t = warpgroup_mma(k_tile.permute((1, 0)), pt_smem.permute((1, 0)), acc_t, is_async=True)
            acc_t = warpgroup_mma_wait(num_outstanding=0, deps=(acc_t,))
            # Every tail warp's wgmmas on this stage are complete: the gather may refill it.
            _cta_barrier()
            mbarrier.arrive(done.index(stage))
        offs_t = first_row + BLOCK_M + gl.arange(0, TAIL_N, layout=gl.SliceLayout(0, ST_LAYOUT))
        _store_part(O_part, LSE_part, acc_t, gl.sum(lt_acc, 0), m_t, v_scale, row0 + offs_t,
                    offs_t < row_end, split, stride_or, stride_op, stride_lr, D_V, 1, ST_LAYOUT)

    @gluon.jit
    def prefix_wgmma_ws_kernel(
        Q, K_buf, kv_indices, qo_indptr, kv_indptr,
        O_part, LSE_part,
        k_scale, v_scale, qk_scale_log2, min_chunk, split_reserve, late_keys, row_base, row_stride,
        stride_qt, stride_qh, stride_ks,
        stride_or, stride_op, stride_lr,
        H: gl.constexpr, D_V: gl.constexpr, D_R: gl.constexpr,
        BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, TAIL_N: gl.constexpr,
        KV_FP8: gl.constexpr, SCALE_FROM_PTR: gl.constexpr, USE_PDL: gl.constexpr, num_warps: gl.constexpr,
    ):
        gl.static_assert(num_warps == 4 and BLOCK_M == 64 and BLOCK_N == 64 and D_R == 64 and TAIL_N > 0,
                         "a 4-warp scorer (64 rows, P in a [BLOCK_N, D_R] rope buffer) and a row tail")
        gl.static_assert(not KV_FP8, "a 16-bit cache: an fp8 one takes prefix_wgmma's kernel")
        (split, q_start, n_rows, kv_start, first_row, row_end, lo, hi, qk_scale,
         out_scale) = _prologue(qo_indptr, kv_indptr, min_chunk, split_reserve, late_keys, row_base, row_stride,
                                k_scale, v_scale, qk_scale_log2, H, BLOCK_N, SCALE_FROM_PTR, USE_PDL)
        # All three partitions run on every program (a warp_specialize region is not branched around): a
        # program past its request's rows, or with an empty chunk, runs no key tile and stores only
        # masked rows or an empty part (LSE -inf), which the merge weighs 0.
        n_tiles = gl.where(first_row < n_rows, gl.maximum(gl.cdiv(hi - lo, BLOCK_N), 0), 0)
        dtype: gl.constexpr = K_buf.dtype.element_ty
        g_nope, g_rope = _key_stages(dtype, NUM_STAGES, BLOCK_N, D_V, D_R)
        NOPE_LAYOUT: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[2, 16],
                                                     warps_per_cta=[num_warps, 1], order=[1, 0])
        ROPE_LAYOUT: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[4, 8],
                                                     warps_per_cta=[num_warps, 1], order=[1, 0])
        qn_smem = _load_queries(Q, q_start, first_row, row_end, stride_qt, stride_qh, 0, BLOCK_M, D_V, H, NOPE_LAYOUT,
                                gl.NVMMASharedLayout.get_default_for([BLOCK_M, D_V], dtype), dtype)
        qr_smem = _load_queries(Q, q_start, first_row, row_end, stride_qt, stride_qh, D_V, BLOCK_M, D_R, H, ROPE_LAYOUT,
                                gl.NVMMASharedLayout.get_default_for([BLOCK_M, D_R], dtype), dtype)
        # The tail's queries: rows first_row + BLOCK_M ... (zeros past row_end).
        tail_row = first_row + BLOCK_M
        tn_smem, tr_smem, pt_smem = _keys_major_queries(Q, q_start, tail_row, row_end, stride_qt, stride_qh, H, D_V,
                                                        D_R, TAIL_N, BLOCK_N, NOPE_LAYOUT, ROPE_LAYOUT, dtype)
        ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        scored = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        p_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        done = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        final = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        for s in gl.static_range(NUM_STAGES):
            mbarrier.init(ready.index(s), count=VALUE_WARPS * 32)
            mbarrier.init(scored.index(s), count=1)
            mbarrier.init(p_ready.index(s), count=1)
            mbarrier.init(done.index(s), count=3)
        mbarrier.init(final, count=1)
        # Per row: each tile's rescale (by stage), then the final normalisation.
        rows_smem = gl.allocate_shared_memory(gl.float32, [NUM_STAGES, BLOCK_M],
                                              gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0]))
        # The queries are wgmma operands of the scorer and the tail.
        fence_async_shared()
        rows0 = q_start * H
        gl.warp_specialize([
            (_scorer_partition, (qn_smem, qr_smem, g_nope, g_rope, rows_smem, ready, scored, p_ready, done, final,
                                 O_part, LSE_part, qk_scale, out_scale, rows0, row_end, lo, hi, n_tiles, first_row,
                                 split, stride_or, stride_op, stride_lr, D_V, BLOCK_M, BLOCK_N, NUM_STAGES)),
            (_values_partition, (g_nope, g_rope, rows_smem, ready, p_ready, done, final, K_buf, kv_indices, O_part,
                                 rows0, row_end, kv_start, lo, hi, n_tiles, first_row, split,
                                 stride_ks, stride_or, stride_op, D_V, D_R, BLOCK_M, BLOCK_N, NUM_STAGES)),
            (_tail_partition, (tn_smem, tr_smem, pt_smem, g_nope, g_rope, ready, scored, done,
                               O_part, LSE_part, qk_scale, out_scale,
                               rows0, row_end, lo, hi, n_tiles, first_row, split,
                               stride_or, stride_op, stride_lr, D_V, BLOCK_M, BLOCK_N, NUM_STAGES, TAIL_N)),
        ], [VALUE_WARPS, TAIL_WARPS], [VALUE_REGS, TAIL_REGS])
        if USE_PDL:
            _grid_dependency(True)
