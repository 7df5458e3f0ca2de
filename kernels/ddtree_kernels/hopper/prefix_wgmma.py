"""Hopper's prefix tiles, written in Gluon: 64 rows (or a few, keys-major), wgmma, explicit gather pipeline.

`prefix_general.py`'s tile, written with `tl.dot`, leaves the GLM-5 shape at ~30% of its floor on
the H200: Triton splits the 64 x BLOCK_N scores across the two warpgroups, so every key
tile's softmax is exchanged between them through shared memory and barriers, and each
wgmma descriptor is rebuilt in the loop (1,477 instructions a warp a 64-key step, 76 of them
wgmma). This kernel does the same work with that structure taken
out of the compiler's hands:

- Each warpgroup scores half the key tile (wgmma layout [4, 2]) and accumulates half of the
  512 value columns. The row maxima are reduced across the two through shared memory, and P
  goes to shared memory too, into the tile's rope buffer (dead once scored), where both value
  wgmmas read it: every tensor op is done once.
- The key tile is gathered by cp.async into `NUM_STAGES` shared buffers, one tile ahead
  (its slot indices one more ahead), and read by both wgmmas in place: values are the first
  512 columns of the key rows.
- With TAIL_N, each row block also takes up to TAIL_N rows past its BLOCK_M (GLM-5: 72 = 64
  + 8; 144 rows: two blocks of 72) on the same key tiles, keys-major so that its few rows
  are wgmma's N: a second launch for them would read the whole prefix again
  (VerifyPlan.fused_tail_rows).
- The queries' shared-memory descriptors are rebuilt in the loop (`_opaque_zero`): hoisted,
  the 72 of them spilled to local memory, and the reloads stalled every step.
- An fp8 cache (KV_FP8) is gathered into 8-bit stages and each tile widened once into one
  fp16 tile that all the wgmmas read (the queries are fp16 too, as in prefix_general.py's fp8 tiles);
  the 8-bit stage is free after the widening, so its gather runs NUM_STAGES tiles ahead.
- With BLOCK_M 0 there is no 64-row block: a request of at most TAIL_N rows (decode: 8) runs
  the keys-major form alone, on one warpgroup or two, so a few rows do not pay for 64 on the
  tensor cores (hopper/rules.py, rules 1-2).
  On an fp8 cache that form (`_attend_rows_fp8`) loads each wgmma's left operand, the key tile
  or its transpose, from the 8-bit stage into registers and widens it there: no 16-bit tile in
  shared memory, so two programs share an SM. The values' operand is read with matrix loads
  (`_value_pairs`) as soon as the scores are in, so the stage takes the tile after next while the
  softmax and the values run.

Same grid and partial outputs as `prefix_general_kernel` (merge.py combines them), for a
bf16/fp16/fp8 cache whose values are the keys' first D_V columns, D_V = 512 and D_R = 64
(GLM-5, DeepSeek). It runs on Triton 3.6-3.9 and an sm_90 GPU; the launcher falls back to
`prefix_general_kernel` everywhere else (`hopper.launch.wgmma_supports`).
"""

from __future__ import annotations

try:  # Gluon ships with Triton 3.5+; this kernel needs 3.6+ (gluon_shared.TESTED_TRITON)
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        async_copy,
        fence_async_shared,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    _GLUON_ERROR = ""
except (ImportError, AttributeError) as err:  # pragma: no cover - depends on the installed Triton
    _GLUON_ERROR = f"triton.experimental.gluon is not usable here ({err})"

if not _GLUON_ERROR:
    from ..gluon_shared import (
        _async_gather,
        _cta_barrier,
        _grid_dependency,
        _prologue,
        _raise_running_max,
    )


def tail_block(tail_rows: int) -> int:
    """TAIL_N for a fused row tail of this many rows: its rows are wgmma's N, a multiple of 8 (0: none)."""
    return -(-tail_rows // 8) * 8


def keys_major_block(rows: int) -> int:
    """TAIL_N for a request of this many rows on the keys-major form alone (BLOCK_M 0): wgmma's N, and the
    extent of the kernel's row ranges, so a power of two, at least 8."""
    return max(8, 1 << (max(rows, 1) - 1).bit_length())


if not _GLUON_ERROR:
    @gluon.jit
    def _opaque_zero():
        """0, computed by an instruction the compiler cannot see through. Indexing the query
        buffers with it keeps their wgmma descriptors in the loop, a few uniform adds each, instead
        of hoisted into 144 registers that spill (LLVM cannot rematerialise them)."""
        return gl.inline_asm_elementwise("mov.b32 $0, 0;", "=r", [], dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def _tile_slots(kv_indices, kv_base, start, hi, BLOCK_N: gl.constexpr, NOPE_LAYOUT: gl.constexpr,
                    ROPE_LAYOUT: gl.constexpr):
        """Cache slots of keys start .. start + BLOCK_N, in the row layouts of both gathers (0 past hi).
        Held as int32 (a pool has fewer than 2**31 rows) while they wait a loop iteration: registers."""
        offs_n = start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, NOPE_LAYOUT))
        offs_r = start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ROPE_LAYOUT))
        slot_n = gl.load(kv_indices + kv_base + offs_n, mask=offs_n < hi, other=0).to(gl.int32)
        slot_r = gl.load(kv_indices + kv_base + offs_r, mask=offs_r < hi, other=0).to(gl.int32)
        return slot_n, slot_r

    @gluon.jit
    def _gather_tile(k_dst, r_dst, slot_n, slot_r, K_buf, start, hi, stride_ks,
                     D_V: gl.constexpr, D_R: gl.constexpr, BLOCK_N: gl.constexpr,
                     NOPE_LAYOUT: gl.constexpr, ROPE_LAYOUT: gl.constexpr):
        """cp.async the key rows at `slot_*` (keys start .. start + BLOCK_N; those from hi on read as
        zeros) into one stage's buffers, as one commit group."""
        offs_n = start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, NOPE_LAYOUT))
        cols = gl.arange(0, D_V, layout=gl.SliceLayout(0, NOPE_LAYOUT))
        _async_gather(k_dst, K_buf + slot_n.to(gl.int64)[:, None] * stride_ks + cols[None, :],
                      mask=(offs_n < hi)[:, None])
        offs_r = start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ROPE_LAYOUT))
        cols_r = D_V + gl.arange(0, D_R, layout=gl.SliceLayout(0, ROPE_LAYOUT))
        _async_gather(r_dst, K_buf + slot_r.to(gl.int64)[:, None] * stride_ks + cols_r[None, :],
                      mask=(offs_r < hi)[:, None])
        async_copy.commit_group()

    @gluon.jit
    def _block_softmax(s, m_i, l_acc, qk_scale_log2, key0, hi, offs_sn):
        """The row block's online softmax step on the key tile from key0 (scores `s`, rows x keys; offs_sn the
        keys' offsets): (P, running maxima, per-element sums, rescale of the state so far)."""
        s = gl.where((key0 + offs_sn < hi)[None, :], s * qk_scale_log2, float("-inf"))
        m_new, m_safe, alpha = _raise_running_max(m_i, gl.max(s, 1))
        p = gl.exp2(s - m_safe[:, None])
        return p, m_new, l_acc * alpha[:, None] + p, alpha

    @gluon.jit
    def _tail_softmax(st, m_t, lt_acc, pt_smem, qk_scale_log2, key0, hi, offs_tn):
        """The row tail's online softmax step on the key tile from key0 (keys-major scores `st`: keys are its
        rows, offs_tn their offsets): P, transposed, into pt_smem (wgmma's B operand). Returns the running
        maxima, the per-element sums and the rescale of the state so far (m_t, lt_acc, alpha_t)."""
        st = gl.where((key0 + offs_tn < hi)[:, None], st * qk_scale_log2, float("-inf"))
        mt_new, mt_safe, alpha_t = _raise_running_max(m_t, gl.max(st, 0))
        pt = gl.exp2(st - mt_safe[None, :])
        lt_acc = lt_acc * alpha_t[None, :] + pt
        pt_smem.store(gl.permute(pt.to(pt_smem.dtype), [1, 0]))
        return mt_new, lt_acc, alpha_t

    @gluon.jit
    def _key_stages(dtype: gl.constexpr, NUM_STAGES: gl.constexpr, BLOCK_N: gl.constexpr, D_V: gl.constexpr,
                    D_R: gl.constexpr):
        """The gathered key tiles' ring: NUM_STAGES [BLOCK_N, D_V] latent stages and [BLOCK_N, D_R] rope stages
        in `dtype` (the cache's), each in wgmma's swizzled layout."""
        g_nope = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, D_V],
                                           gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_V], dtype))
        g_rope = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, D_R],
                                           gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_R], dtype))
        return g_nope, g_rope

    @gluon.jit
    def _gather_ahead(g_nope, g_rope, kv_indices, kv_base, K_buf, lo, hi, stride_ks, AHEAD: gl.constexpr,
                      D_V: gl.constexpr, D_R: gl.constexpr, BLOCK_N: gl.constexpr, NOPE_LAYOUT: gl.constexpr,
                      ROPE_LAYOUT: gl.constexpr):
        """Gather the chunk's first AHEAD key tiles into stages 0 .. AHEAD - 1 and return the slots of tile AHEAD:
        each gather's slots are loaded an iteration before it, or its addresses would wait for a dependent
        global load every iteration."""
        for t in gl.static_range(AHEAD):
            slot_n, slot_r = _tile_slots(kv_indices, kv_base, lo + t * BLOCK_N, hi, BLOCK_N, NOPE_LAYOUT, ROPE_LAYOUT)
            _gather_tile(g_nope.index(t), g_rope.index(t), slot_n, slot_r, K_buf, lo + t * BLOCK_N, hi,
                         stride_ks, D_V, D_R, BLOCK_N, NOPE_LAYOUT, ROPE_LAYOUT)
        return _tile_slots(kv_indices, kv_base, lo + AHEAD * BLOCK_N, hi, BLOCK_N, NOPE_LAYOUT, ROPE_LAYOUT)

    @gluon.jit
    def _keys_major_queries(Q, q_start, first_row, row_end, stride_qt, stride_qh, H: gl.constexpr,
                            D_V: gl.constexpr, D_R: gl.constexpr, TAIL_N: gl.constexpr, BLOCK_N: gl.constexpr,
                            NOPE_LAYOUT: gl.constexpr, ROPE_LAYOUT: gl.constexpr, dtype: gl.constexpr,
                            PERMUTED: gl.constexpr = False):
        """The keys-major rows' shared buffers: their queries (rows first_row .. first_row + TAIL_N, as
        `_load_queries`, columns permuted with PERMUTED) and P transposed ([TAIL_N, BLOCK_N]), all wgmma B
        operands in `dtype`."""
        tn_smem = _load_queries(Q, q_start, first_row, row_end, stride_qt, stride_qh, 0, TAIL_N, D_V, H, NOPE_LAYOUT,
                                gl.NVMMASharedLayout.get_default_for([TAIL_N, D_V], dtype), dtype, PERMUTED)
        tr_smem = _load_queries(Q, q_start, first_row, row_end, stride_qt, stride_qh, D_V, TAIL_N, D_R, H, ROPE_LAYOUT,
                                gl.NVMMASharedLayout.get_default_for([TAIL_N, D_R], dtype), dtype, PERMUTED)
        pt_smem = gl.allocate_shared_memory(dtype, [TAIL_N, BLOCK_N],
                                            gl.NVMMASharedLayout.get_default_for([TAIL_N, BLOCK_N], dtype))
        return tn_smem, tr_smem, pt_smem

    @gluon.jit
    def _keys_major_state(D_V: gl.constexpr, BLOCK_N: gl.constexpr, TAIL_N: gl.constexpr, ST_LAYOUT: gl.constexpr):
        """The keys-major rows' online-softmax state at the start of a chunk: (output [D_V, TAIL_N], per-element
        sums, running maxima, a zero score tile, the key offsets of a tile)."""
        acc_t = gl.zeros([D_V, TAIL_N], gl.float32, ST_LAYOUT)
        lt_acc = gl.zeros([BLOCK_N, TAIL_N], gl.float32, ST_LAYOUT)
        m_t = gl.full([TAIL_N], float("-inf"), gl.float32, gl.SliceLayout(0, ST_LAYOUT))
        st_zero = gl.zeros([BLOCK_N, TAIL_N], gl.float32, ST_LAYOUT)
        offs_tn = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ST_LAYOUT))
        return acc_t, lt_acc, m_t, st_zero, offs_tn

    @gluon.jit
    def _load_queries(Q, q_start, first_row, row_end, stride_qt, stride_qh, COL0: gl.constexpr, ROWS: gl.constexpr,
                      COLS: gl.constexpr, H: gl.constexpr, LAYOUT: gl.constexpr, SMEM: gl.constexpr,
                      SMEM_DTYPE: gl.constexpr, PERMUTED: gl.constexpr = False):
        """Query rows first_row .. first_row + ROWS (zeros from row_end on), columns COL0 .. COL0 + COLS,
        into shared memory in the cache's dtype (a wgmma operand for the whole loop), as a [1, ROWS,
        COLS] buffer for `.index(_opaque_zero())`. PERMUTED: columns in `_key_column`'s order, in chunks
        of up to 128 (`_key_operand`'s)."""
        offs = first_row + gl.arange(0, ROWS, layout=gl.SliceLayout(1, LAYOUT))
        ptrs = Q + (q_start + offs // H).to(gl.int64)[:, None] * stride_qt + (offs % H)[:, None] * stride_qh
        cols = gl.arange(0, COLS, layout=gl.SliceLayout(0, LAYOUT))
        if PERMUTED:
            CHUNK: gl.constexpr = 128 if COLS > 128 else COLS
            cols = cols // CHUNK * CHUNK + _key_column(cols % CHUNK, CHUNK)
        cols = COL0 + cols
        q = gl.load(ptrs + cols[None, :], mask=(offs < row_end)[:, None], other=0.0)
        buf = gl.allocate_shared_memory(SMEM_DTYPE, [1, ROWS, COLS], SMEM)
        buf.index(0).store(q.to(SMEM_DTYPE))
        return buf

    @gluon.jit
    def _store_part(O_part, LSE_part, acc, l_i, m_i, v_scale, rows, row_ok, split, stride_or, stride_op, stride_lr,
                    D_V: gl.constexpr, ROW_AXIS: gl.constexpr, LAYOUT: gl.constexpr,
                    VALUES_PAIRED: gl.constexpr = False):
        """One part's normalised output (times the values' dequantisation scale) and base-2 LSE (-inf
        where nothing was seen); `acc` holds rows along ROW_AXIS (1: the tail's transposed [D_V, rows]
        accumulator), `l_i`, `m_i`, `rows` and `row_ok` are in SliceLayout(1 - ROW_AXIS, LAYOUT)."""
        seen = l_i > 0.0
        l_safe = gl.where(seen, l_i, 1.0)
        lse = gl.where(seen, m_i + gl.log2(l_safe), float("-inf"))
        norm = v_scale / l_safe
        offs_dv = gl.arange(0, D_V, layout=gl.SliceLayout(ROW_AXIS, LAYOUT))
        if VALUES_PAIRED:
            offs_dv = _value_column(offs_dv)
        row_off = rows.to(gl.int64) * stride_or + split * stride_op
        if ROW_AXIS == 0:
            gl.store(O_part + row_off[:, None] + offs_dv[None, :], acc * norm[:, None], mask=row_ok[:, None])
        else:
            gl.store(O_part + row_off[None, :] + offs_dv[:, None], acc * norm[None, :], mask=row_ok[None, :])
        gl.store(LSE_part + rows.to(gl.int64) * stride_lr + split, lse, mask=row_ok)

    @gluon.jit
    def _widen_tile(src, dst, ROWS: gl.constexpr, LAYOUT: gl.constexpr):
        """An 8-bit key tile in shared memory, converted to the dots' 16-bit dtype into `dst`
        (fp8 -> fp16 is one native convert), 16 rows at a time to bound the registers it takes."""
        for r in gl.static_range(0, ROWS, 16):
            tile = src.slice(r, 16, dim=0).load(LAYOUT)
            dst.slice(r, 16, dim=0).store(tile.to(dst.dtype))

    @gluon.jit
    def _landed_tile(g_nope, g_rope, k_smem, r_smem, stage, AHEAD: gl.constexpr, BLOCK_N: gl.constexpr,
                     KV_FP8: gl.constexpr, G_NOPE: gl.constexpr, G_ROPE: gl.constexpr):
        """(keys, rope) of the tile in `stage` once every warp can read it: waited for and, for an fp8
        cache, widened into the 16-bit tile (k_smem, r_smem) the wgmmas read."""
        # Tile i has landed (this thread's copies), then everyone's: and every warp is past
        # tile i - 1, whose buffers the next gather (or widening) overwrites.
        async_copy.wait_group(AHEAD - 1)
        _cta_barrier()
        if KV_FP8:
            k_tile = k_smem.index(0)
            r_tile = r_smem.index(0)
            _widen_tile(g_nope.index(stage), k_tile, BLOCK_N, G_NOPE)
            _widen_tile(g_rope.index(stage), r_tile, BLOCK_N, G_ROPE)
            # Every warp has read this 8-bit stage (the gather refills it) and written its share
            # of the 16-bit tile (the wgmmas read it).
            fence_async_shared()
            _cta_barrier()
        else:
            fence_async_shared()
            k_tile = k_smem.index(stage)
            r_tile = r_smem.index(stage)
        return k_tile, r_tile

    @gluon.jit
    def _block_values(s, acc, m_i, l_acc, k_tile, r_tile, qk_scale_log2, key0, hi, offs_sn, dtype: gl.constexpr,
                      O_LAYOUT: gl.constexpr):
        """The row block's softmax of its scores `s` and the issue of its value wgmma (not waited for)."""
        # Row maxima across both warpgroups' keys (through shared memory); sums per element.
        p, m_i, l_acc, alpha = _block_softmax(s, m_i, l_acc, qk_scale_log2, key0, hi, offs_sn)
        # Both warpgroups' values need all of P: it goes to shared memory, into this stage's
        # rope buffer ([BLOCK_N, D_R], the shape of P), which no wgmma reads any more once
        # every warp has waited for its scores (the barrier). That costs no shared memory:
        # GLM-5's block uses 231,936 of the 232,448 bytes.
        _cta_barrier()
        r_tile.store(p.to(dtype))
        fence_async_shared()
        _cta_barrier()
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_LAYOUT))[:, None]
        acc = warpgroup_mma(r_tile, k_tile, acc, is_async=True)
        return acc, m_i, l_acc

    @gluon.jit
    def _tail_values(st, acc_t, m_t, lt_acc, k_tile, pt_smem, qk_scale_log2, key0, hi, offs_tn):
        """The row tail's softmax of its keys-major scores `st` (while the tensor cores run the block's
        values, if any) and the issue of its value wgmma (not waited for)."""
        # Its row maxima span the warps (keys are its rows here); its sums stay per element until the end.
        m_t, lt_acc, alpha_t = _tail_softmax(st, m_t, lt_acc, pt_smem, qk_scale_log2, key0, hi, offs_tn)
        # Every warp's share of P is in shared memory before wgmma reads it.
        fence_async_shared()
        _cta_barrier()
        acc_t = acc_t * alpha_t[None, :]
        acc_t = warpgroup_mma(k_tile.permute((1, 0)), pt_smem.permute((1, 0)), acc_t, is_async=True)
        return acc_t, m_t, lt_acc

    @gluon.jit
    def _attend_chunk(
        Q, K_buf, kv_indices, O_part, LSE_part, qk_scale_log2, v_scale,
        q_start, row_end, kv_base, lo, hi, first_row, split,
        stride_qt, stride_qh, stride_ks, stride_or, stride_op, stride_lr,
        H: gl.constexpr, D_V: gl.constexpr, D_R: gl.constexpr,
        BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, TAIL_N: gl.constexpr,
        KV_FP8: gl.constexpr, WARPS: gl.constexpr,
    ):
        """Rows first_row .. first_row + BLOCK_M (and, if TAIL_N, the up to TAIL_N rows after them),
        those before row_end, against keys lo .. hi: write their parts for this split. WARPS is the
        program's warps: 8 with a row block, 4 or 8 for the keys-major rows alone (BLOCK_M 0)."""
        # Scores: [BLOCK_M, BLOCK_N] on warps [4, 2]: warpgroup g scores keys g * BLOCK_N / 2 ...
        S_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                           instr_shape=[16, BLOCK_N // 2, 16])
        # Output: [BLOCK_M, D_V] on warps [4, 2]: warpgroup g owns value columns g * D_V / 2 ...
        O_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                           instr_shape=[16, D_V // 2, 16])
        # Query loads: 16-byte vectors of 16-bit values, a row's D_V columns across 16 threads.
        NOPE_LAYOUT: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[2, 16],
                                                     warps_per_cta=[WARPS, 1], order=[1, 0])
        ROPE_LAYOUT: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[4, 8],
                                                     warps_per_cta=[WARPS, 1], order=[1, 0])
        if KV_FP8:
            # 8-bit rows: 16-byte vectors of 16 values, a row's D_V columns across a warp. The dots
            # run in fp16 (as prefix_general.py's fp8 tiles): each gathered tile is widened once into a
            # 16-bit tile that both wgmmas read, so the 8-bit stages are free one step sooner and
            # the gather runs NUM_STAGES tiles ahead instead of NUM_STAGES - 1.
            G_NOPE: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 16], threads_per_warp=[1, 32],
                                                    warps_per_cta=[WARPS, 1], order=[1, 0])
            G_ROPE: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 16], threads_per_warp=[8, 4],
                                                    warps_per_cta=[WARPS, 1], order=[1, 0])
            dtype: gl.constexpr = gl.float16
            AHEAD: gl.constexpr = NUM_STAGES
        else:
            # The dots run in the cache's dtype (bf16 or fp16), on the gathered tiles in place.
            G_NOPE: gl.constexpr = NOPE_LAYOUT
            G_ROPE: gl.constexpr = ROPE_LAYOUT
            dtype: gl.constexpr = K_buf.dtype.element_ty
            AHEAD: gl.constexpr = NUM_STAGES - 1
        kv_dtype: gl.constexpr = K_buf.dtype.element_ty
        g_nope, g_rope = _key_stages(kv_dtype, NUM_STAGES, BLOCK_N, D_V, D_R)
        if KV_FP8:
            k_smem = gl.allocate_shared_memory(dtype, [1, BLOCK_N, D_V],
                                               gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_V], dtype))
            r_smem = gl.allocate_shared_memory(dtype, [1, BLOCK_N, D_R],
                                               gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_R], dtype))
        else:
            k_smem = g_nope
            r_smem = g_rope
        slot_n, slot_r = _gather_ahead(g_nope, g_rope, kv_indices, kv_base, K_buf, lo, hi, stride_ks, AHEAD, D_V, D_R,
                                       BLOCK_N, G_NOPE, G_ROPE)

        if BLOCK_M > 0:
            qn_smem = _load_queries(Q, q_start, first_row, row_end, stride_qt, stride_qh, 0, BLOCK_M, D_V, H,
                                    NOPE_LAYOUT, gl.NVMMASharedLayout.get_default_for([BLOCK_M, D_V], dtype), dtype)
            qr_smem = _load_queries(Q, q_start, first_row, row_end, stride_qt, stride_qh, D_V, BLOCK_M, D_R, H,
                                    ROPE_LAYOUT, gl.NVMMASharedLayout.get_default_for([BLOCK_M, D_R], dtype), dtype)
            acc = gl.zeros([BLOCK_M, D_V], gl.float32, O_LAYOUT)
            l_acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, S_LAYOUT)
            m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, gl.SliceLayout(1, S_LAYOUT))
            s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, S_LAYOUT)
            offs_sn = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_LAYOUT))

        if TAIL_N > 0:
            # The row tail, keys-major so that its few rows are wgmma's N: scores [BLOCK_N, TAIL_N]
            # (repeated by a second warpgroup, if any) and output [D_V, TAIL_N] (each warpgroup its
            # share of the columns), on the same key tiles. P goes through shared memory: wgmma's B operand.
            ST_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                                instr_shape=[16, TAIL_N, 16])
            tn_smem, tr_smem, pt_smem = _keys_major_queries(Q, q_start, first_row + BLOCK_M, row_end, stride_qt,
                                                            stride_qh, H, D_V, D_R, TAIL_N, BLOCK_N, NOPE_LAYOUT,
                                                            ROPE_LAYOUT, dtype)
            acc_t, lt_acc, m_t, st_zero, offs_tn = _keys_major_state(D_V, BLOCK_N, TAIL_N, ST_LAYOUT)

        n_tiles = gl.cdiv(hi - lo, BLOCK_N)
        for i in range(n_tiles):
            k_tile, r_tile = _landed_tile(g_nope, g_rope, k_smem, r_smem, i % NUM_STAGES, AHEAD, BLOCK_N, KV_FP8,
                                          G_NOPE, G_ROPE)
            z = _opaque_zero()
            if BLOCK_M > 0:
                s = warpgroup_mma(qn_smem.index(z), k_tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
                s = warpgroup_mma(qr_smem.index(z), r_tile.permute((1, 0)), s, is_async=True)
            if TAIL_N > 0:
                st = warpgroup_mma(k_tile, tn_smem.index(z).permute((1, 0)), st_zero, use_acc=False, is_async=True)
                st = warpgroup_mma(r_tile, tr_smem.index(z).permute((1, 0)), st, is_async=True)
            # While the scores run: gather tile i + AHEAD into the 8-bit stage just widened (fp8) or
            # into the buffer tile i - 1 left (every warp is past it: the barrier above), and load
            # the slots of the one after.
            ahead = lo + (i + AHEAD) * BLOCK_N
            free = (i + AHEAD) % NUM_STAGES
            _gather_tile(g_nope.index(free), g_rope.index(free), slot_n, slot_r, K_buf, ahead, hi, stride_ks,
                         D_V, D_R, BLOCK_N, G_NOPE, G_ROPE)
            slot_n, slot_r = _tile_slots(kv_indices, kv_base, ahead + BLOCK_N, hi, BLOCK_N, G_NOPE, G_ROPE)
            if BLOCK_M > 0:
                if TAIL_N > 0:
                    s, st = warpgroup_mma_wait(num_outstanding=0, deps=(s, st))
                else:
                    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
                acc, m_i, l_acc = _block_values(s, acc, m_i, l_acc, k_tile, r_tile, qk_scale_log2, lo + i * BLOCK_N, hi,
                                                offs_sn, dtype, O_LAYOUT)
            elif TAIL_N > 0:
                st = warpgroup_mma_wait(num_outstanding=0, deps=(st,))
            if TAIL_N > 0:
                acc_t, m_t, lt_acc = _tail_values(st, acc_t, m_t, lt_acc, k_tile, pt_smem, qk_scale_log2,
                                                  lo + i * BLOCK_N, hi, offs_tn)
            if BLOCK_M > 0 and TAIL_N > 0:
                acc, acc_t = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc_t))
            elif BLOCK_M > 0:
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            else:
                acc_t = warpgroup_mma_wait(num_outstanding=0, deps=(acc_t,))
        async_copy.wait_group(0)

        if BLOCK_M > 0:
            offs_m = first_row + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, O_LAYOUT))
            _store_part(O_part, LSE_part, acc, gl.convert_layout(gl.sum(l_acc, 1), gl.SliceLayout(1, O_LAYOUT)),
                        gl.convert_layout(m_i, gl.SliceLayout(1, O_LAYOUT)), v_scale, q_start * H + offs_m,
                        offs_m < row_end, split, stride_or, stride_op, stride_lr, D_V, 0, O_LAYOUT)
        if TAIL_N > 0:
            offs_t = first_row + BLOCK_M + gl.arange(0, TAIL_N, layout=gl.SliceLayout(0, ST_LAYOUT))
            _store_part(O_part, LSE_part, acc_t, gl.sum(lt_acc, 0), m_t, v_scale, q_start * H + offs_t,
                        offs_t < row_end, split, stride_or, stride_op, stride_lr, D_V, 1, ST_LAYOUT)

    @gluon.jit
    def _value_pairs(v8, A_LAYOUT: gl.constexpr):
        """An 8-bit [64 keys, D_V] value tile read as 16-bit column pairs and transposed, in the values' wgmma A
        layout: [D_V / 2, 64], element [j, k] the bytes of columns 2j, 2j + 1 of key k. A transposed 16-bit load
        is a matrix load (ldmatrix .trans), 16 a thread where the 8-bit transpose took 256 single-byte loads."""
        D_V: gl.constexpr = v8.shape[1]
        v16 = v8.reinterpret(gl.int16, [v8.shape[0], D_V // 2],
                             gl.NVMMASharedLayout.get_default_for([v8.shape[0], D_V // 2], gl.int16))
        return v16.permute((1, 0)).load(A_LAYOUT)

    @gluon.jit
    def _value_column(m):
        """The value column that row m of `_widen_value_pairs` holds: m = 128b + 64p + r holds 128b + 2r + p."""
        return m // 128 * 128 + m % 64 * 2 + m // 64 % 2

    @gluon.jit
    def _widen_value_pairs(pairs, A_LAYOUT: gl.constexpr):
        """`_value_pairs` (e4m3) as the values' fp16 wgmma A operand, [D_V, 64], rows in `_value_column`'s order.
        A register of pairs holds columns 2j, 2j + 1 of keys k, k + 1; one byte permute makes it the two fp8 pairs
        (keys k, k + 1 of one column) that cvt widens, and the rows stay with the threads that hold them."""
        even, odd = gl.inline_asm_elementwise(
            "{ .reg .b32 t; .reg .b16 lo, hi; prmt.b32 t, $2, 0, 0x3120; mov.b32 {lo, hi}, t; "
            "cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi; }",
            "=r,=r,r", [pairs], dtype=(gl.float16, gl.float16), is_pure=True, pack=2)
        b: gl.constexpr = pairs.shape[0] // 64
        v = gl.join(gl.reshape(even, [b, 64, 64]), gl.reshape(odd, [b, 64, 64]))  # [b, r, key, p]
        v = gl.reshape(gl.permute(v, (0, 3, 1, 2)), [pairs.shape[0] * 2, 64])
        return gl.convert_layout(v, A_LAYOUT)

    @gluon.jit
    def _key_column(k, W: gl.constexpr):
        """The column of a W-wide chunk (128 or 64) that column k of `_key_operand` holds: k = 16s + 8f + 2c + e
        holds W/4 c + 4s + 2f + e. The queries are staged in the same order, so the scores are unchanged."""
        return (k % 8 // 2) * (W // 4) + (k // 16) * 4 + (k // 8 % 2) * 2 + k % 2

    @gluon.jit
    def _key_operand(chunk, A_LAYOUT: gl.constexpr, dtype: gl.constexpr):
        """An 8-bit [64 keys, W] slice of the key tile (W 128 or 64) as the scores' wgmma A operand in registers,
        widened to `dtype`, its columns in `_key_column`'s order: each thread then loads W/4 contiguous bytes of
        a key row instead of 2-byte pairs (4 warps)."""
        W: gl.constexpr = chunk.shape[1]
        if W == 128:
            K_LOAD: gl.constexpr = gl.DistributedLinearLayout(
                reg_bases=[[0, 1], [0, 2], [0, 4], [0, 8], [0, 16], [8, 0]],
                lane_bases=[[0, 32], [0, 64], [1, 0], [2, 0], [4, 0]],
                warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[64, 128])
            k = gl.permute(gl.reshape(chunk.load(K_LOAD), [64, 4, 8, 2, 2]), (0, 2, 3, 1, 4))
        else:
            K_LOAD: gl.constexpr = gl.DistributedLinearLayout(
                reg_bases=[[0, 1], [0, 2], [0, 4], [0, 8], [8, 0]],
                lane_bases=[[0, 16], [0, 32], [1, 0], [2, 0], [4, 0]],
                warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[64, 64])
            k = gl.permute(gl.reshape(chunk.load(K_LOAD), [64, 4, 4, 2, 2]), (0, 2, 3, 1, 4))
        return gl.convert_layout(gl.reshape(k, [64, W]), A_LAYOUT).to(dtype)

    @gluon.jit
    def _attend_rows_fp8(
        Q, K_buf, kv_indices, O_part, LSE_part, qk_scale_log2, v_scale,
        q_start, row_end, kv_base, lo, hi, first_row, split,
        stride_qt, stride_qh, stride_ks, stride_or, stride_op, stride_lr,
        H: gl.constexpr, D_V: gl.constexpr, D_R: gl.constexpr,
        BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, TAIL_N: gl.constexpr, WARPS: gl.constexpr,
    ):
        """The keys-major rows alone (BLOCK_M 0) on an fp8 cache: each wgmma's left operand (the key tile for
        the scores, the value tile transposed for the output) is loaded from the 8-bit stage straight into
        registers and widened there, so no 16-bit tile is written to shared memory and read back. The key
        operand's columns, and the staged queries', are permuted (`_key_column`) so that a thread loads contiguous
        bytes. The transposed value operand is read as 16-bit column pairs (`_value_pairs`, its rows permuted by
        `_value_column`, undone at the store) right after the scores: the stage is then free, and the gather of
        tile i + NUM_STAGES goes out before the softmax, two tiles in flight a program instead of one."""
        gl.static_assert(WARPS == 4 and BLOCK_N == 64, "_key_operand's load layout: one warpgroup, 64 keys")
        ST_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                            instr_shape=[16, TAIL_N, 16])
        A_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ST_LAYOUT, k_width=2)
        NOPE_LAYOUT: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[2, 16],
                                                     warps_per_cta=[WARPS, 1], order=[1, 0])
        ROPE_LAYOUT: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[4, 8],
                                                     warps_per_cta=[WARPS, 1], order=[1, 0])
        G_NOPE: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 16], threads_per_warp=[1, 32],
                                                warps_per_cta=[WARPS, 1], order=[1, 0])
        G_ROPE: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 16], threads_per_warp=[8, 4],
                                                warps_per_cta=[WARPS, 1], order=[1, 0])
        dtype: gl.constexpr = gl.float16
        kv_dtype: gl.constexpr = K_buf.dtype.element_ty
        g_nope, g_rope = _key_stages(kv_dtype, NUM_STAGES, BLOCK_N, D_V, D_R)
        slot_n, slot_r = _gather_ahead(g_nope, g_rope, kv_indices, kv_base, K_buf, lo, hi, stride_ks, NUM_STAGES, D_V,
                                       D_R, BLOCK_N, G_NOPE, G_ROPE)

        tn_smem, tr_smem, pt_smem = _keys_major_queries(Q, q_start, first_row, row_end, stride_qt, stride_qh, H, D_V,
                                                        D_R, TAIL_N, BLOCK_N, NOPE_LAYOUT, ROPE_LAYOUT, dtype, True)
        acc_t, lt_acc, m_t, st_zero, offs_tn = _keys_major_state(D_V, BLOCK_N, TAIL_N, ST_LAYOUT)
        n_tiles = gl.cdiv(hi - lo, BLOCK_N)
        for i in range(n_tiles):
            stage = i % NUM_STAGES
            # Tile i has landed (everyone's copies; tile i + 1's may still be in flight); the queries and the
            # last P are in shared memory for the wgmmas.
            async_copy.wait_group(NUM_STAGES - 1)
            _cta_barrier()
            fence_async_shared()
            k8 = g_nope.index(stage)
            z = _opaque_zero()
            tq = tn_smem.index(z)
            st = warpgroup_mma(_key_operand(k8.slice(0, 128, dim=1), A_LAYOUT, dtype),
                               tq.slice(0, 128, dim=1).permute((1, 0)), st_zero, use_acc=False, is_async=True)
            for c in gl.static_range(128, D_V, 128):
                st = warpgroup_mma(_key_operand(k8.slice(c, 128, dim=1), A_LAYOUT, dtype),
                                   tq.slice(c, 128, dim=1).permute((1, 0)), st, is_async=True)
            st = warpgroup_mma(_key_operand(g_rope.index(stage), A_LAYOUT, dtype), tr_smem.index(z).permute((1, 0)),
                               st, is_async=True)
            st = warpgroup_mma_wait(num_outstanding=0, deps=(st,))
            # The stage's last reader: once every warp holds its value operand, the stage takes tile
            # i + NUM_STAGES, so each program keeps two tiles in flight through the softmax and the values.
            pairs = _value_pairs(k8, A_LAYOUT)
            _cta_barrier()
            ahead = lo + (i + NUM_STAGES) * BLOCK_N
            _gather_tile(g_nope.index(stage), g_rope.index(stage), slot_n, slot_r, K_buf, ahead, hi, stride_ks,
                         D_V, D_R, BLOCK_N, G_NOPE, G_ROPE)
            slot_n, slot_r = _tile_slots(kv_indices, kv_base, ahead + BLOCK_N, hi, BLOCK_N, G_NOPE, G_ROPE)
            m_t, lt_acc, alpha_t = _tail_softmax(st, m_t, lt_acc, pt_smem, qk_scale_log2, lo + i * BLOCK_N, hi,
                                                 offs_tn)
            fence_async_shared()
            _cta_barrier()
            acc_t = acc_t * alpha_t[None, :]
            acc_t = warpgroup_mma(_widen_value_pairs(pairs, A_LAYOUT), pt_smem.permute((1, 0)), acc_t, is_async=True)
            acc_t = warpgroup_mma_wait(num_outstanding=0, deps=(acc_t,))
        async_copy.wait_group(0)
        offs_t = first_row + gl.arange(0, TAIL_N, layout=gl.SliceLayout(0, ST_LAYOUT))
        _store_part(O_part, LSE_part, acc_t, gl.sum(lt_acc, 0), m_t, v_scale, q_start * H + offs_t,
                    offs_t < row_end, split, stride_or, stride_op, stride_lr, D_V, 1, ST_LAYOUT, True)

    @gluon.jit
    def prefix_wgmma_kernel(
        Q, K_buf, kv_indices, qo_indptr, kv_indptr,
        O_part, LSE_part,
        k_scale, v_scale, qk_scale_log2, min_chunk, split_reserve, late_keys, row_base, row_stride,
        stride_qt, stride_qh, stride_ks,
        stride_or, stride_op, stride_lr,
        H: gl.constexpr, D_V: gl.constexpr, D_R: gl.constexpr,
        BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, TAIL_N: gl.constexpr,
        KV_FP8: gl.constexpr, SCALE_FROM_PTR: gl.constexpr, USE_PDL: gl.constexpr, num_warps: gl.constexpr,
    ):
        gl.static_assert(num_warps == 8 or (BLOCK_M == 0 and num_warps == 4),
                         "two warpgroups, one per half of the value columns (keys-major rows only: one or two)")
        gl.static_assert((BLOCK_M == 64 or (BLOCK_M == 0 and TAIL_N > 0)) and BLOCK_N == 64 and D_R == 64,
                         "one wgmma row block (or none: keys-major rows only); P ([BLOCK_M, BLOCK_N]) reuses a "
                         "[BLOCK_N, D_R] rope buffer")
        gl.static_assert(BLOCK_M + TAIL_N <= 128, "an empty chunk marks at most 128 rows")
        (split, q_start, n_rows, kv_start, first_row, row_end, lo, hi, qk_scale,
         out_scale) = _prologue(qo_indptr, kv_indptr, min_chunk, split_reserve, late_keys, row_base, row_stride,
                                k_scale, v_scale, qk_scale_log2, H, BLOCK_N, SCALE_FROM_PTR, USE_PDL)
        if first_row < n_rows:
            if lo >= hi:
                # An empty chunk: LSE -inf for this block's rows, its tail's included.
                LSE_LAYOUT: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
                offs = first_row + gl.arange(0, 128, layout=LSE_LAYOUT)
                gl.store(LSE_part + (q_start * H + offs).to(gl.int64) * stride_lr + split,
                         gl.full([128], float("-inf"), gl.float32, LSE_LAYOUT), mask=offs < row_end)
            elif BLOCK_M == 0 and KV_FP8:  # constexprs: keys-major rows only, fp8 (decode on an fp8 cache)
                _attend_rows_fp8(Q, K_buf, kv_indices, O_part, LSE_part, qk_scale, out_scale, q_start, row_end,
                                 kv_start, lo, hi, first_row, split, stride_qt, stride_qh, stride_ks, stride_or,
                                 stride_op, stride_lr, H, D_V, D_R, BLOCK_N, NUM_STAGES, TAIL_N, num_warps)
            elif BLOCK_M == 0:  # a constexpr: keys-major rows only (requests of a few rows, e.g. decode)
                _attend_chunk(Q, K_buf, kv_indices, O_part, LSE_part, qk_scale, out_scale, q_start, row_end,
                              kv_start, lo, hi, first_row, split, stride_qt, stride_qh, stride_ks, stride_or,
                              stride_op, stride_lr, H, D_V, D_R, 0, BLOCK_N, NUM_STAGES, TAIL_N, KV_FP8, num_warps)
            elif TAIL_N > 0 and row_end > first_row + BLOCK_M:  # TAIL_N is a constexpr: with 0 the tail
                # form is not even compiled. Rows past row_end are masked, the tail's and the block's.
                _attend_chunk(Q, K_buf, kv_indices, O_part, LSE_part, qk_scale, out_scale, q_start, row_end,
                              kv_start, lo, hi, first_row, split, stride_qt, stride_qh, stride_ks, stride_or,
                              stride_op, stride_lr, H, D_V, D_R, BLOCK_M, BLOCK_N, NUM_STAGES, TAIL_N, KV_FP8,
                              num_warps)
            else:
                _attend_chunk(Q, K_buf, kv_indices, O_part, LSE_part, qk_scale, out_scale, q_start, row_end,
                              kv_start, lo, hi, first_row, split, stride_qt, stride_qh, stride_ks, stride_or,
                              stride_op, stride_lr, H, D_V, D_R, BLOCK_M, BLOCK_N, NUM_STAGES, 0, KV_FP8, num_warps)
        if USE_PDL:
            # As in prefix_general_kernel: complete only after the launch this one depends on.
            _grid_dependency(True)
