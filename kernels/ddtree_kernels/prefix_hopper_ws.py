"""The Gluon wide tile with its row tail on a warpgroup of its own (warp-specialized), for Hopper.

In `prefix_hopper`'s wide tile the 8-row tail (GLM-5: 72 rows = 64 + 8) runs in the same
instruction stream as the 64-row block, after it, on every key tile: its keys-major wgmmas
(N = 8) and its softmax add ~1.07 µs to a 3.27 µs tile (sweep log, session 9), for 12.5%
more rows. Here the tail is a partition of its own (`gl.warp_specialize`): four more warps
that score and accumulate the tail rows on the same shared key tiles while the block's two
warpgroups do the block, so the tail's dependent chain no longer adds to the block's. GLM-5 at
185k: 109.2 -> 98.5 µs, H16 n9 186.5 -> 165.6, H8 n33 351.8 -> 308.4 (sweep log, session 11).

- The block partition (the kernel's 8 warps) gathers the key tiles as `prefix_hopper` does,
  and tells the tail partition through mbarriers when a tile has landed (`ready`).
- The tail partition says when it has scored a tile (`scored`: the block may then write its
  P into the tile's rope buffer) and when it is done with it (`done`: the gather may refill it).
- The tail scores in five independent wgmma chains (four of 128 latent columns, one of rope) that
  it adds up: one chain of 36 m64n8k16 steps, each waiting for the last, was its critical path.
- Each partition writes its own rows' part; the merge is unchanged. The block stages its part in the
  key stages once both partitions are done with them (`_store_block_part`), so each warp writes whole
  512-byte rows instead of the accumulator's 8-byte pairs spread over 8 rows: GLM-5 185k H16 n9
  165.9 -> 162.4 µs, 64k H16 n33 248.0 -> 242.8, but 8k +1.4 µs (sweep log, session 13).
- Registers (setmaxnreg): the tail's 128 threads hold 80 each, the block's 256 threads 208 (the
  kernel without a partition took 217 for the block alone; no spills under Triton 3.6).

Same grid, arguments and partial outputs as `prefix_hopper.prefix_wide_hopper_kernel`; a bf16 or
fp16 cache whose values are the keys' first D_V columns, D_V = 512, D_R = 64, BLOCK_M 64 with a
row tail (TAIL_N > 0). Triton 3.6-3.9 on an sm_90 GPU, as `prefix_hopper`.
"""

from __future__ import annotations

from . import prefix_hopper

if not prefix_hopper.unavailable_reason():
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        async_copy,
        fence_async_shared,
        mbarrier,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    from .prefix_hopper import (
        _block_softmax,
        _cta_barrier,
        _dequant_scales,
        _gather_ahead,
        _gather_tile,
        _grid_dependency,
        _keys_major_queries,
        _keys_major_state,
        _load_queries,
        _opaque_zero,
        _program_work,
        _store_part,
        _tail_softmax,
        _tile_slots,
    )

    # The tail partition's warps and the registers each of its threads may hold (setmaxnreg); the block's
    # 256 threads get the rest. 8 tail warps do not build: 16 warps cap the whole kernel at 128 registers
    # a thread, fewer than the block's value wgmma needs (ptxas C7602, session 11).
    TAIL_WARPS = gl.constexpr(4)
    TAIL_REGS = gl.constexpr(80)

    @gluon.jit
    def _store_block_part(stages, O_part, LSE_part, acc, l_i, m_i, v_scale, row0, first_row, row_end, split,
                          stride_or, stride_op, stride_lr, BLOCK_M: gl.constexpr, D_V: gl.constexpr,
                          O_LAYOUT: gl.constexpr):
        """The block's part as `_store_part`'s, staged in `stages` (free shared memory of at least
        BLOCK_M x D_V fp32) so that a warp stores one row's 512 contiguous bytes an instruction. It does
        not call `_store_part` on the staged rows: normalising after the staging is 0.6-5 µs slower
        (GLM-5 185k 96.2 -> 97.2, H8 n33 301.7 -> 306.5; sweep log, session 13 (13))."""
        l_i = gl.convert_layout(l_i, gl.SliceLayout(1, O_LAYOUT))
        seen = l_i > 0.0
        l_safe = gl.where(seen, l_i, 1.0)
        # 16-byte units XOR-swizzled by row: the accumulator's 8 rows an instruction land on distinct banks.
        staged = stages.reinterpret(gl.float32, [BLOCK_M, D_V],
                                    gl.SwizzledSharedLayout(vec=4, per_phase=1, max_phase=8, order=[1, 0]))
        staged.store(acc * (v_scale / l_safe)[:, None])
        _cta_barrier()
        ROW_LAYOUT: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 4], threads_per_warp=[1, 32],
                                                    warps_per_cta=[8, 1], order=[1, 0])
        offs_m = first_row + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, ROW_LAYOUT))
        cols = gl.arange(0, D_V, layout=gl.SliceLayout(0, ROW_LAYOUT))
        rows = (row0 + offs_m).to(gl.int64)
        gl.store(O_part + (rows * stride_or + split * stride_op)[:, None] + cols[None, :], staged.load(ROW_LAYOUT),
                 mask=(offs_m < row_end)[:, None])
        offs_l = first_row + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, O_LAYOUT))
        lse = gl.where(seen, gl.convert_layout(m_i, gl.SliceLayout(1, O_LAYOUT)) + gl.log2(l_safe), float("-inf"))
        gl.store(LSE_part + (row0 + offs_l).to(gl.int64) * stride_lr + split, lse, mask=offs_l < row_end)

    @gluon.jit
    def _block_partition(
        qn_smem, qr_smem, g_nope, g_rope, ready, scored, done,
        K_buf, kv_indices, O_part, LSE_part, qk_scale_log2, v_scale,
        row0, row_end, kv_base, lo, hi, n_tiles, first_row, split,
        stride_ks, stride_or, stride_op, stride_lr,
        D_V: gl.constexpr, D_R: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
        NUM_STAGES: gl.constexpr,
    ):
        """The 64-row block on 8 warps, as prefix_hopper._attend_chunk's, and the gathers for both partitions."""
        S_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                           instr_shape=[16, BLOCK_N // 2, 16])
        O_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                           instr_shape=[16, D_V // 2, 16])
        NOPE_LAYOUT: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[2, 16],
                                                     warps_per_cta=[8, 1], order=[1, 0])
        ROPE_LAYOUT: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[4, 8],
                                                     warps_per_cta=[8, 1], order=[1, 0])
        AHEAD: gl.constexpr = NUM_STAGES - 1
        dtype: gl.constexpr = g_nope.dtype
        slot_n, slot_r = _gather_ahead(g_nope, g_rope, kv_indices, kv_base, K_buf, lo, hi, stride_ks, AHEAD, D_V, D_R,
                                       BLOCK_N, NOPE_LAYOUT, ROPE_LAYOUT)
        acc = gl.zeros([BLOCK_M, D_V], gl.float32, O_LAYOUT)
        l_acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, S_LAYOUT)
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, gl.SliceLayout(1, S_LAYOUT))
        s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, S_LAYOUT)
        offs_sn = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_LAYOUT))
        for i in range(n_tiles):
            stage = i % NUM_STAGES
            phase = (i // NUM_STAGES) & 1
            async_copy.wait_group(AHEAD - 1)
            _cta_barrier()
            fence_async_shared()
            # Tile i is in shared memory (every block thread's copies): the tail may score it too.
            mbarrier.arrive(ready.index(stage))
            k_tile = g_nope.index(stage)
            r_tile = g_rope.index(stage)
            z = _opaque_zero()
            s = warpgroup_mma(qn_smem.index(z), k_tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            s = warpgroup_mma(qr_smem.index(z), r_tile.permute((1, 0)), s, is_async=True)
            # The next gather refills the stage of tile i + AHEAD - NUM_STAGES, once the tail is done with it too.
            ahead = lo + (i + AHEAD) * BLOCK_N
            free = (i + AHEAD) % NUM_STAGES
            mbarrier.wait(done.index(free), ((i + AHEAD - NUM_STAGES) // NUM_STAGES) & 1,
                          pred=i + AHEAD >= NUM_STAGES)
            _gather_tile(g_nope.index(free), g_rope.index(free), slot_n, slot_r, K_buf, ahead, hi, stride_ks,
                         D_V, D_R, BLOCK_N, NOPE_LAYOUT, ROPE_LAYOUT)
            slot_n, slot_r = _tile_slots(kv_indices, kv_base, ahead + BLOCK_N, hi, BLOCK_N, NOPE_LAYOUT, ROPE_LAYOUT)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
            p, m_i, l_acc, alpha = _block_softmax(s, m_i, l_acc, qk_scale_log2, lo + i * BLOCK_N, hi, offs_sn)
            # P goes into this stage's rope buffer once both warpgroups and the tail have scored it.
            _cta_barrier()
            mbarrier.wait(scored.index(stage), phase)
            r_tile.store(p.to(dtype))
            fence_async_shared()
            _cta_barrier()
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_LAYOUT))[:, None]
            acc = warpgroup_mma(r_tile, k_tile, acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        async_copy.wait_group(0)
        # The part goes out through shared memory, in whole 512-byte row pieces a warp: stored straight from
        # the accumulator, each instruction writes 8-byte pairs on 8 rows. The key stages hold it (a
        # [64, 512] fp32 tile is their 128 KB) once both warpgroups and the tail are done with them.
        _cta_barrier()
        last = gl.maximum(n_tiles - 1, 0)
        mbarrier.wait(done.index(last % NUM_STAGES), (last // NUM_STAGES) & 1, pred=n_tiles > 0)
        _store_block_part(g_nope, O_part, LSE_part, acc, gl.sum(l_acc, 1), m_i, v_scale, row0, first_row, row_end,
                          split, stride_or, stride_op, stride_lr, BLOCK_M, D_V, O_LAYOUT)

    @gluon.jit
    def _tail_partition(
        tn_smem, tr_smem, pt_smem, g_nope, g_rope, ready, scored, done,
        O_part, LSE_part, qk_scale_log2, v_scale,
        row0, row_end, lo, hi, n_tiles, first_row, split,
        stride_or, stride_op, stride_lr,
        D_V: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
        TAIL_N: gl.constexpr,
    ):
        """The row tail, keys-major (its rows are wgmma's N) on 4 warps, on the block partition's key tiles."""
        ST_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[TAIL_WARPS, 1],
                                                            instr_shape=[16, TAIL_N, 16])
        acc_t, lt_acc, m_t, st_zero, offs_tn = _keys_major_state(D_V, BLOCK_N, TAIL_N, ST_LAYOUT)
        for i in range(n_tiles):
            stage = i % NUM_STAGES
            phase = (i // NUM_STAGES) & 1
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
    def prefix_wide_ws_kernel(
        Q, K_buf, kv_indices, qo_indptr, kv_indptr,
        O_part, LSE_part,
        k_scale, v_scale, qk_scale_log2, min_chunk, split_reserve, row_base, row_stride,
        stride_qt, stride_qh, stride_ks,
        stride_or, stride_op, stride_lr,
        H: gl.constexpr, D_V: gl.constexpr, D_R: gl.constexpr,
        BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, TAIL_N: gl.constexpr,
        KV_FP8: gl.constexpr, SCALE_FROM_PTR: gl.constexpr, USE_PDL: gl.constexpr, num_warps: gl.constexpr,
    ):
        gl.static_assert(num_warps == 8 and BLOCK_M == 64 and BLOCK_N == 64 and D_R == 64 and TAIL_N > 0,
                         "the block's two warpgroups (64 rows, P in a [BLOCK_N, D_R] rope buffer) and a row tail")
        gl.static_assert(not KV_FP8, "a 16-bit cache: an fp8 one takes prefix_hopper's kernel")
        if USE_PDL:
            _grid_dependency(False)
        split, q_start, n_rows, kv_start, first_row, row_end, lo, hi = _program_work(
            qo_indptr, kv_indptr, min_chunk, split_reserve, row_base, row_stride, H, BLOCK_N)
        qk_scale, out_scale = _dequant_scales(k_scale, v_scale, qk_scale_log2, SCALE_FROM_PTR)
        # Both partitions run on every program (a warp_specialize region is not branched around): a
        # program past its request's rows, or with an empty chunk, runs no key tile and stores only
        # masked rows or an empty part (LSE -inf), which the merge weighs 0.
        n_tiles = gl.where(first_row < n_rows, gl.maximum(gl.cdiv(hi - lo, BLOCK_N), 0), 0)
        dtype: gl.constexpr = K_buf.dtype.element_ty
        g_nope = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, D_V],
                                           gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_V], dtype))
        g_rope = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, D_R],
                                           gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_R], dtype))
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
        done = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(NUM_STAGES):
            mbarrier.init(ready.index(s), count=1)
            mbarrier.init(scored.index(s), count=1)
            mbarrier.init(done.index(s), count=1)
        # The queries are wgmma operands of both partitions.
        fence_async_shared()
        rows0 = q_start * H
        gl.warp_specialize([
            (_block_partition, (qn_smem, qr_smem, g_nope, g_rope, ready, scored, done,
                                K_buf, kv_indices, O_part, LSE_part, qk_scale, out_scale,
                                rows0, row_end, kv_start, lo, hi, n_tiles, first_row, split,
                                stride_ks, stride_or, stride_op, stride_lr, D_V, D_R, BLOCK_M, BLOCK_N, NUM_STAGES)),
            (_tail_partition, (tn_smem, tr_smem, pt_smem, g_nope, g_rope, ready, scored, done,
                               O_part, LSE_part, qk_scale, out_scale,
                               rows0, row_end, lo, hi, n_tiles, first_row, split,
                               stride_or, stride_op, stride_lr, D_V, BLOCK_M, BLOCK_N, NUM_STAGES, TAIL_N)),
        ], [TAIL_WARPS], [TAIL_REGS])
        if USE_PDL:
            _grid_dependency(True)
