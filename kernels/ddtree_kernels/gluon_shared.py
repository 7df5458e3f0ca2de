"""What the Gluon kernels share: the Triton releases they run on, the names Gluon changed between
them, and the helpers that are not specific to one GPU (split bounds, scales, softmax step, PDL).

`hopper/prefix_wgmma.py` (wgmma) and `sm120/prefix_latent_split.py` (mma.sync) import these; Gluon kernels
cannot call `triton.jit` functions, so `prefix_general.py`'s Triton forms are written again here.
"""

from __future__ import annotations

import triton

try:  # Gluon ships with Triton 3.5+; the kernels need 3.6+ (TESTED_TRITON)
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy

    _GLUON_ERROR = ""
except (ImportError, AttributeError) as err:  # pragma: no cover - depends on the installed Triton
    _GLUON_ERROR = f"triton.experimental.gluon is not usable here ({err})"

# Gluon is experimental and renames things between releases: the kernels run on the Triton
# releases they were built and compiled with (3.6 on the H200, 3.9 in CI, `make fit`), and a newer
# one falls back to the Triton tiles until this range is widened after `make fit` passes there.
TESTED_TRITON = ((3, 6), (3, 9))


def _minor_version(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def unavailable_reason(version: str | None = None) -> str:
    """Why this Triton (or the one named by `version`) does not run the Gluon kernels ('' when it does)."""
    if _GLUON_ERROR:
        return _GLUON_ERROR
    version = version or triton.__version__
    low, high = TESTED_TRITON
    if not low <= _minor_version(version) <= high:
        return (f"Triton {version} is outside {low[0]}.{low[1]}-{high[0]}.{high[1]}, the releases this Gluon "
                f"kernel is checked on (gluon_shared.TESTED_TRITON)")
    return ""


if not _GLUON_ERROR:
    # Renamed after 3.6: gl.thread_barrier -> gl.barrier, async_copy_global_to_shared -> async_load.
    _cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier
    _async_gather = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
    # ... and shared_memory_descriptor.reinterpret was _reinterpret in 3.6 (same arguments, given positionally).
    if not hasattr(gl.shared_memory_descriptor, "reinterpret"):
        gl.shared_memory_descriptor.reinterpret = gl.shared_memory_descriptor._reinterpret

    @gluon.jit
    def _grid_dependency(WAIT: gl.constexpr):
        """griddepcontrol (programmatic dependent launch, sm_90): let the next launch start, or
        wait for the previous grid. Same PTX as triton.language.extra.cuda's gdc_* helpers."""
        if WAIT:
            gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
        else:
            gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                                      is_pure=False, pack=1)

    @gluon.jit
    def _raise_running_max(m_i, tile_max):
        """(m_new, m_safe, alpha) as tile.raise_running_max (a Triton function Gluon cannot call): the
        running maximum after a tile, its -inf-safe form to subtract, and the rescale of the state so far."""
        m_new = gl.maximum(m_i, tile_max)
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        return m_new, m_safe, gl.exp2(m_i - m_safe)

    @gluon.jit
    def _program_work(qo_indptr, kv_indptr, min_chunk, split_reserve, late_keys, row_base, row_stride,
                      H: gl.constexpr, BLOCK_N: gl.constexpr):
        """This program's split, its request's rows and keys, its row block and its key chunk:
        (split, q_start, n_rows, kv_start, first_row, row_end, lo, hi). Row block j owns rows row_stride * j ..
        row_stride * (j + 1) (the Hopper tile: BLOCK_M of them on the score wgmma and the rest, at most TAIL_N,
        as its keys-major row tail). The keys are chunked in whole key tiles, at least min_chunk a
        split (as prefix_general_kernel's), the last `split_reserve` splits taking `late_keys` fewer each (none
        where that leaves them nothing): their programs start late (VerifyPlan.split_reserve)."""
        row_block = gl.program_id(0)
        split = gl.program_id(1)
        req = gl.program_id(2)
        num_splits = gl.num_programs(1)
        early = num_splits - split_reserve
        q_start = gl.load(qo_indptr + req).to(gl.int32)
        n_rows = (gl.load(qo_indptr + req + 1).to(gl.int32) - q_start) * H
        kv_start = gl.load(kv_indptr + req).to(gl.int64)
        prefix_len = (gl.load(kv_indptr + req + 1).to(gl.int64) - kv_start).to(gl.int32)
        first_row = row_base + row_block * row_stride
        row_end = gl.minimum(n_rows, first_row + row_stride)
        # num_splits * chunk - split_reserve * late_keys >= prefix_len, or, where that chunk is no longer than
        # late_keys, the early splits alone cover the keys.
        chunk = gl.cdiv(gl.maximum(gl.cdiv(prefix_len + split_reserve * late_keys, num_splits), min_chunk),
                        BLOCK_N) * BLOCK_N
        alone = gl.cdiv(gl.maximum(gl.cdiv(prefix_len, early), min_chunk), BLOCK_N) * BLOCK_N
        short = gl.where(chunk > late_keys, chunk - late_keys, 0)
        chunk = gl.where(chunk > late_keys, chunk, alone)
        lo = gl.where(split < early, split * chunk, early * chunk + (split - early) * short)
        hi = gl.minimum(lo + gl.where(split < early, chunk, short), prefix_len)
        return split, q_start, n_rows, kv_start, first_row, row_end, lo, hi

    @gluon.jit
    def _prologue(qo_indptr, kv_indptr, min_chunk, split_reserve, late_keys, row_base, row_stride, k_scale, v_scale,
                  qk_scale_log2, H: gl.constexpr, BLOCK_N: gl.constexpr, SCALE_FROM_PTR: gl.constexpr,
                  USE_PDL: gl.constexpr):
        """What every Gluon prefix program does first: let the next launch start (PDL), then its work
        (_program_work) and its scales (_dequant_scales): (split, q_start, n_rows, kv_start, first_row, row_end, lo,
        hi, qk_scale, out_scale)."""
        if USE_PDL:
            _grid_dependency(False)
        split, q_start, n_rows, kv_start, first_row, row_end, lo, hi = _program_work(
            qo_indptr, kv_indptr, min_chunk, split_reserve, late_keys, row_base, row_stride, H, BLOCK_N)
        qk_scale, out_scale = _dequant_scales(k_scale, v_scale, qk_scale_log2, SCALE_FROM_PTR)
        return split, q_start, n_rows, kv_start, first_row, row_end, lo, hi, qk_scale, out_scale

    @gluon.jit
    def _dequant_scales(k_scale, v_scale, qk_scale_log2, SCALE_FROM_PTR: gl.constexpr):
        """(scale of the scores, scale of the stored output): k_scale folds into the first, v_scale is the
        second (1 for a 16-bit cache). Passed as floats, or as 0-dim device tensors (no host sync)."""
        if SCALE_FROM_PTR:
            qk_scale = qk_scale_log2 * gl.load(k_scale).to(gl.float32)
            out_scale = gl.load(v_scale).to(gl.float32)
        else:
            qk_scale = qk_scale_log2 * k_scale
            out_scale = v_scale
        return qk_scale, out_scale
