"""Session 6, no GPU: does Triton's automatic warp specialization (`tl.range(..., warp_specialize=True)`)
split the prefix kernel's key loop on sm_90? Needs kernels/results/probes/warp_specialize.patch applied
(on commit 06e6e57). Compiles the shipped Hopper bf16 tiles with and without it and counts the
`ttg.warp_specialize` partitions in the TTGIR.

    git apply kernels/results/probes/warp_specialize.patch
    PYTHONPATH=kernels python kernels/results/probes/warp_specialize_check.py
"""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ddtree_kernels.configs import HOPPER
from ddtree_kernels.fit import _ALIGNED, _PREFIX_SIG
from ddtree_kernels.prefix import prefix_split_kernel as fn

sig = {k: ("*bf16" if v == "*KV" else v) for k, v in _PREFIX_SIG.items()}
full = {n: sig.get(n, "constexpr") for n in fn.arg_names}
attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in sig if a in _ALIGNED}
for name, tile in (("wide", HOPPER.prefix_wide), ("16-row", HOPPER.prefix)):
    for ws in (False, True):
        const = dict(H=8, D_V=512, D_R=64, BLOCK_DV=512, BLOCK_DR=64, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n,
                     V_FROM_K=True, SCALE_FROM_PTR=False, WIDEN_TO_FP16=False, DOT_FP32=False, PREFETCH_L2=True,
                     USE_PDL=True, KEYS_MAJOR=False, WARP_SPECIALIZE=ws)
        try:
            c = triton.compile(ASTSource(fn, full, const, attrs), target=GPUTarget("cuda", 90, 32),
                               options={"num_warps": tile.num_warps, "num_stages": tile.num_stages})
            ttgir = c.asm["ttgir"]
            print(f"Triton {triton.__version__} {name} warp_specialize={ws}: shared {c.metadata.shared} B, "
                  f"ttg.warp_specialize ops {ttgir.count('ttg.warp_specialize')}, "
                  f"loop attribute kept {ttgir.count('tt.warp_specialize')}")
        except Exception as exc:  # the pass may assert: that is a result
            print(f"Triton {triton.__version__} {name} warp_specialize={ws}: {type(exc).__name__}: "
                  f"{str(exc).splitlines()[0][:100]}")
