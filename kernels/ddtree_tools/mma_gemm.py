"""The mma.sync GEMM ceilings, bf16 and e4m3, from one Gluon GEMM (bench.py reports both).

Triton lowers an fp8 `tl.dot` to fp16 MMAs once wgmma is off (DISABLE_MMA_V3=1), so its fp8 GEMM measures the
fp16 instruction. Gluon's `mma_v2` takes e4m3 operands (k_width 4) and emits `mma.sync ... m16n8k32 ... e4m3`,
the instruction sm_89 and sm_120 run natively. On sm_90 ptxas has no such instruction and rewrites each one into
conversions to fp16 and two fp16 MMAs (`fit.sass_mma` counts them), so there the e4m3 ceiling measures that rewrite.

C = A @ B^T with A [M, K] and B [N, K] both K-contiguous (how an 8-bit MMA operand loads from shared memory),
a 128 x 128 tile on 8 warps, K in cp.async stages.
"""

from __future__ import annotations

import torch

from ddtree_kernels.gluon_shared import _GLUON_ERROR

if not _GLUON_ERROR:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

    from ddtree_kernels.gluon_shared import _async_gather, _cta_barrier

    @gluon.jit
    def _stage(a_s, b_s, A, B, rm, rn, rk, K, k0, ok):
        _async_gather(a_s, A + rm[:, None] * K + (k0 + rk)[None, :], mask=ok)
        _async_gather(b_s, B + rn[:, None] * K + (k0 + rk)[None, :], mask=ok)
        async_copy.commit_group()

    @gluon.jit
    def mma_gemm_kernel(A, B, C, M, N, K, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                        STAGES: gl.constexpr, num_warps: gl.constexpr):
        """C = A @ B^T (sizes multiples of the blocks), fp32 accumulation, bf16 C."""
        dtype: gl.constexpr = A.dtype.element_ty
        K_WIDTH: gl.constexpr = 32 // dtype.primitive_bitwidth
        VEC: gl.constexpr = 128 // dtype.primitive_bitwidth  # 16 bytes
        MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[num_warps // 2, 2],
                                                      instr_shape=[16, 8])
        A_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=K_WIDTH)
        B_OP: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=K_WIDTH)
        LOAD: gl.constexpr = gl.BlockedLayout([1, VEC], [32 * VEC // BLOCK_K, BLOCK_K // VEC], [num_warps, 1], [1, 0])
        SMEM: gl.constexpr = gl.SwizzledSharedLayout(VEC, 1, 8, order=[1, 0])
        a_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, BLOCK_K], SMEM)
        b_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, BLOCK_K], SMEM)
        rm = gl.program_id(0) * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, LOAD))
        rn = gl.program_id(1) * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LOAD))
        rk = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, LOAD))
        n_k = K // BLOCK_K
        for s in gl.static_range(STAGES - 1):
            _stage(a_s.index(s), b_s.index(s), A, B, rm, rn, rk, K, s * BLOCK_K, s < n_k)
        acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, MMA)
        for i in range(n_k):
            async_copy.wait_group(STAGES - 2)
            _cta_barrier()  # every warp is past step i - 1, whose stage the next load refills
            j = i + STAGES - 1
            _stage(a_s.index(j % STAGES), b_s.index(j % STAGES), A, B, rm, rn, rk, K, j * BLOCK_K, j < n_k)
            a = a_s.index(i % STAGES).load(A_OP)
            b = b_s.index(i % STAGES).permute((1, 0)).load(B_OP)
            acc = mma_v2(a, b, acc)
        async_copy.wait_group(0)
        cm = gl.program_id(0) * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, MMA))
        cn = gl.program_id(1) * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, MMA))
        gl.store(C + cm[:, None] * N + cn[None, :], acc.to(gl.bfloat16))


def mma_gemm(a: torch.Tensor, b: torch.Tensor, stages: int = 3):
    """(C = a @ b.T in bf16, the compiled kernel): a [M, K], b [N, K], bf16 or float8_e4m3fn, sizes multiples
    of 128."""
    if _GLUON_ERROR:
        raise RuntimeError(_GLUON_ERROR)
    (m, k), n = a.shape, b.shape[0]
    block_k = 128 if a.element_size() == 1 else 64  # 128-byte rows of shared memory either way
    if m % 128 or n % 128 or k % block_k or b.shape[1] != k or a.dtype != b.dtype:
        raise ValueError(f"mma_gemm: a {tuple(a.shape)} and b {tuple(b.shape)} must share dtype and K, with M, N "
                         f"multiples of 128 and K of {block_k}")
    c = torch.empty(m, n, dtype=torch.bfloat16, device=a.device)
    compiled = mma_gemm_kernel[(m // 128, n // 128)](a, b, c, m, n, k, BLOCK_M=128, BLOCK_N=128, BLOCK_K=block_k,
                                                       STAGES=stages, num_warps=8)
    return c, compiled

