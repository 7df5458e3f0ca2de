"""No GPU: compile one shipped prefix variant for a target and print the main loop's memory and dot
ops in order (TTGIR), with the count of asynchronous gathers. Shows where Triton's pipeliner puts the
next tile's gather and whether an 8-bit key tile is loaded synchronously.

    PYTHONPATH=kernels python kernels/results/probes/ttgir_loop.py hopper 'kv=bf16,v_from_k=True,wide' 90
    PYTHONPATH=kernels python kernels/results/probes/ttgir_loop.py hopper 'kv=fp8e4nv,v_from_k=True' 90 [0|1]

The optional last argument overrides KEYS_MAJOR.
"""
import re
import sys

import triton
from ddtree_kernels import fit
from ddtree_kernels.configs import SHIPPED
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

config, want, cap = sys.argv[1], sys.argv[2], int(sys.argv[3])
kernel, variant, sig, const, warps, stages, _ = next(v for v in fit._variants(SHIPPED[config]) if v[1] == want)
if len(sys.argv) > 4:
    const = dict(const, KEYS_MAJOR=bool(int(sys.argv[4])))
fn = fit._kernel(kernel)
full = {n: sig.get(n, "constexpr") for n in fn.arg_names}
attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in sig if a in fit._ALIGNED}
c = triton.compile(ASTSource(fn, full, const, attrs), target=GPUTarget("cuda", cap, 32),
                   options={"num_warps": warps, "num_stages": stages})
ttgir = c.asm["ttgir"]
loop = ttgir[[m.start() for m in re.finditer(r"scf\.for", ttgir)][-1]:]  # the key loop (the last one)
loop = loop[:loop.index("scf.yield")]
OPS = ("ttg.async_wait", "ttg.async_copy_global_to_local", "tt.load ", "ttg.local_alloc", "ttng.warp_group_dot ",
       "tt.dot ", "tt.fp_to_fp")


def describe(line: str) -> str:
    op = next(o for o in OPS if o in line).strip()
    ptr = re.search(r"tensor<([0-9x]+)x!tt\.ptr<(\w+)>", line)  # what a load or gather reads
    return f"{op}[{ptr.group(1)} {ptr.group(2)}]" if ptr else op


ops = [describe(line) for line in loop.splitlines() if any(o in line for o in OPS)]
print(f"{config} sm_{cap} {variant} KEYS_MAJOR={const['KEYS_MAJOR']} warps={warps} stages={stages}")
print("  loop ops in order:", " | ".join(ops))
print("  async gathers:", loop.count("async_copy_global_to_local"),
      " synchronous loads:", ", ".join(o for o in ops if o.startswith("tt.load")))
