"""Every kernel a plan can launch, by name: what it supports and how a plan launches it.

`run_verify` calls an entry's function with its own runtime parameters filled by name; `fit` compiles
it with the types in `ARG_TYPES`. Nothing else lists a kernel's arguments.
"""

from __future__ import annotations

import dataclasses

from .hopper.launch import ENTRIES as HOPPER_ENTRIES
from .merge import merge_parts_kernel
from .plan_types import KernelEntry, Launch, Tile, VerifyShape
from .prefix_general import prefix_general_kernel
from .sm120 import prefix_latent_split, prefix_latent_split_e4m3
from .sm120.prefix_chunked import prefix_chunked_kernel
from .target import Target
from .tree import tree_block_kernel

# Types of every runtime argument name (fit's offline compile); "*KV" is the cache's dtype.
ARG_TYPES = dict(
    Q="*bf16", K_buf="*KV", V_buf="*KV", kv_indices="*i64", qo_indptr="*i32", kv_indptr="*i32",
    O_part="*fp32", LSE_part="*fp32", k_scale="fp32", v_scale="fp32", qk_scale_log2="fp32", min_chunk="i32",
    row_base="i32", split_reserve="i32", late_keys="i32", row_stride="i32", K_tree="*bf16", V_tree="*bf16",
    mask="*u8", mask_indptr="*i64", part="i32", mask_row_stride="i32", Out="*bf16", LSE_out="*fp32",
    batch="i32", num_parts="i32", stride_qt="i32", stride_qh="i32", stride_ks="i32", stride_vs="i32",
    stride_kt="i32", stride_vt="i32", stride_or="i32", stride_op="i32", stride_lr="i32", stride_ot="i32",
    stride_oh="i32", stride_lse_t="i32",
)
# Arguments that are multiples of 16 in every real GLM-5 / DeepSeek call (pointers, 576/512 strides): the
# JIT's divisibility hints, which fit passes so its shared-memory figures are the JIT's.
ALIGNED_ARGS = frozenset({
    "Q", "K_buf", "V_buf", "kv_indices", "qo_indptr", "kv_indptr", "O_part", "LSE_part", "K_tree",
    "V_tree", "mask", "mask_indptr", "Out", "LSE_out", "stride_qt", "stride_qh", "stride_ks", "stride_vs",
    "stride_kt", "stride_vt", "stride_or", "stride_op", "stride_ot", "stride_oh",
})


def _always(target: Target, shape: VerifyShape) -> bool:
    return True


def _pow2(x: int) -> bool:
    return x >= 16 and x & (x - 1) == 0


def chunked_supports(target: Target, shape: VerifyShape) -> bool:
    """A 16-bit cache with values in the keys, D_V / 4 and D_R powers of two of at least 16 (its dots)."""
    return (not shape.kv_fp8 and shape.v_from_k and shape.d_v % 4 == 0 and _pow2(shape.d_v // 4)
            and _pow2(shape.d_rope))


def latent_split_supports(target: Target, shape: VerifyShape) -> bool:
    """A Triton that builds the Gluon tile, compiled; a 16-bit cache with values in the keys, D_V 512, D_R 64."""
    return target.compiled_gluon and not shape.kv_fp8 and shape.v_from_k and shape.d_v == 512 and shape.d_rope == 64


def latent_split_fp8_supports(target: Target, shape: VerifyShape) -> bool:
    """The same for an fp8 cache."""
    return target.compiled_gluon and shape.kv_fp8 and shape.v_from_k and shape.d_v == 512 and shape.d_rope == 64


def _tile_launch(tile: Tile) -> dict[str, int]:
    """A prefix launch's warps, stages and programs an SM: its tile's."""
    return dict(num_warps=tile.num_warps, num_stages=tile.num_stages, programs_per_sm=tile.programs_per_sm)


def _prefix_scalars(plan, row_base: int) -> tuple[tuple[str, int], ...]:
    return (("min_chunk", plan.table.min_chunk), ("row_base", row_base))


def _general_launch(plan, tile: Tile, row_base: int, row_blocks: int) -> Launch:
    return Launch(kernel="prefix_general", grid=(row_blocks, plan.num_splits, plan.batch_size),
                  constexprs=(*plan.dims(padded=True), ("BLOCK_M", tile.block_m), ("BLOCK_N", tile.block_n),
                              ("V_FROM_K", plan.v_from_k), ("WIDEN_TO_FP16", plan.kv_fp8),
                              ("PREFETCH_L2", plan.prefetch), ("USE_PDL", plan.pdl), ("KEYS_MAJOR", tile.keys_major)),
                  scalars=_prefix_scalars(plan, row_base), **_tile_launch(tile), row_base=row_base, note="(tl.dot)")


def _chunked_launch(plan, tile: Tile, row_base: int, row_blocks: int) -> Launch:
    return Launch(kernel="prefix_chunked", grid=(row_blocks, plan.num_splits, plan.batch_size),
                  constexprs=(*plan.dims(), ("BLOCK_M", tile.block_m), ("BLOCK_N", tile.block_n),
                              ("PREFETCH_L2", plan.prefetch), ("USE_PDL", plan.pdl)),
                  scalars=_prefix_scalars(plan, row_base), **_tile_launch(tile), row_base=row_base,
                  note="(tl.dot, 4 score chains)")


def _latent_split_launch(plan, tile: Tile, row_base: int, row_blocks: int) -> Launch:
    return Launch(kernel=tile.kernel, grid=(row_blocks, plan.num_splits, plan.batch_size),
                  constexprs=(*plan.dims(), ("BLOCK_M", tile.block_m), ("BLOCK_N", tile.block_n),
                              ("USE_PDL", plan.pdl)),
                  scalars=_prefix_scalars(plan, row_base), **_tile_launch(tile), row_base=row_base,
                  note="(Gluon mma.sync, latent split)")


def _latent_split_e4m3_launch(plan, tile: Tile, row_base: int, row_blocks: int) -> Launch:
    """As the other latent-split tiles, plus the queries' e4m3 passes (tile option q_passes, default 2)."""
    launch = _latent_split_launch(plan, tile, row_base, row_blocks)
    return dataclasses.replace(launch, constexprs=(*launch.constexprs, ("Q_PASSES", tile.option("q_passes", 2))),
                               note="(Gluon mma.sync e4m3, latent split)")


def _tree_launch(plan) -> Launch:
    tile = plan.table.tree
    return Launch(kernel="tree", grid=(plan.row_blocks(tile.block_m), plan.batch_size),
                  constexprs=(*plan.dims(padded=True), ("BLOCK_M", tile.block_m), ("BLOCK_N", tile.block_n),
                              ("USE_PDL", plan.pdl)),
                  scalars=(("part", plan.num_splits),), num_warps=tile.num_warps, num_stages=tile.num_stages,
                  programs_per_sm=0)


def _merge_launch(plan) -> Launch:
    grid, block_d, block_s = plan.merge_grid
    return Launch(kernel="merge", grid=grid,
                  constexprs=(("H", plan.num_heads), ("D_V", plan.d_v), ("BLOCK_D", block_d), ("BLOCK_S", block_s),
                              ("USE_PDL", plan.pdl)),
                  scalars=(("batch", plan.batch_size), ("num_parts", plan.num_parts)),
                  num_warps=plan.table.merge_num_warps, num_stages=1, programs_per_sm=0)


_PREFIX_VARIANTS = ((("SCALE_FROM_PTR", False), ("DOT_FP32", False)),)
_GLUON_VARIANTS = ((("SCALE_FROM_PTR", False),),)

KERNELS: dict[str, KernelEntry] = {entry.name: entry for entry in (
    KernelEntry("tree", tree_block_kernel, _always, _tree_launch, label="tree",
                compile_variants=tuple((("MASK_MODE", m), ("DOT_FP32", False)) for m in (1, 0, 2))),
    KernelEntry("prefix_general", prefix_general_kernel, _always, _general_launch, label="prefix",
                compile_variants=_PREFIX_VARIANTS),
    KernelEntry("prefix_chunked", prefix_chunked_kernel, chunked_supports, _chunked_launch, label="prefix_chunked",
                needs="16-bit, V in K, D_V/4 and D_R powers of 2",
                compile_variants=_PREFIX_VARIANTS),
    # Defined where the installed Triton builds Gluon kernels (gluon_shared.unavailable_reason); a target
    # without Gluon never selects it.
    KernelEntry("prefix_latent_split", getattr(prefix_latent_split, "prefix_latent_split_kernel", None),
                latent_split_supports, _latent_split_launch, gluon=True, compile_variants=_GLUON_VARIANTS,
                label="prefix_latent_split", needs="Gluon, compiled, V in K, D 512+64"),
    KernelEntry("prefix_latent_split_fp8", getattr(prefix_latent_split, "prefix_latent_split_fp8_kernel", None),
                latent_split_fp8_supports, _latent_split_launch, gluon=True, compile_variants=_GLUON_VARIANTS,
                label="prefix_latent_split_fp8", needs="Gluon, compiled, V in K, D 512+64"),
    KernelEntry("prefix_latent_split_e4m3",
                getattr(prefix_latent_split_e4m3, "prefix_latent_split_e4m3_kernel", None),
                latent_split_fp8_supports, _latent_split_e4m3_launch, gluon=True, compile_variants=_GLUON_VARIANTS,
                label="prefix_latent_split_e4m3", needs="Gluon, compiled, V in K, D 512+64"),
    *HOPPER_ENTRIES,
    KernelEntry("merge", merge_parts_kernel, _always, _merge_launch, label="merge",
                compile_variants=((("STORE_LSE", True),),)),
)}
