import sys, re, dataclasses, triton
from ddtree_kernels import fit
from ddtree_kernels.configs import PORTABLE, TileConfig
from triton.compiler import ASTSource
from triton.backends.compiler import GPUTarget
bm,bn,w,st,cap,vi = map(int, sys.argv[1:7])
cfg = dataclasses.replace(PORTABLE, prefix=TileConfig(bm,bn,w,st), prefix_split_v=TileConfig(bm,bn,w,st), prefix_fp8=TileConfig(bm,bn,w,st))
kernel, variant, sig, const, warps, stages, _ = fit._variants(cfg)[vi]
fn = fit._kernel(kernel)
full = {n: sig.get(n, "constexpr") for n in fn.arg_names}
attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in sig if a in fit._ALIGNED}
c = triton.compile(ASTSource(fn, full, const, attrs), target=GPUTarget("cuda", cap, 32), options={"num_warps": warps, "num_stages": stages})
ttgir = c.asm["ttgir"]
print(variant, "shared", c.metadata.shared)
print("  K buffers:", re.findall(r"local_alloc : \(\) -> !ttg.memdesc<(\d+)x\d+x512x", ttgir), "waits:", re.findall(r"async_wait[^{]*\{num = (\d+)", ttgir))
print("  waits", re.findall(r"async_wait[^{]*\{num = \d+", ttgir))
