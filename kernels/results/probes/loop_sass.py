"""Session 6, no GPU: opcode histogram of one prefix variant's key loop in SASS (the backward
branch's body), compiled for sm_90 by the Triton found on PYTHONPATH's ddtree_kernels.

    python kernels/results/probes/loop_sass.py 64 64 8 2                 # BLOCK_M BLOCK_N warps stages
    python kernels/results/probes/loop_sass.py 64 64 8 2 KEYS_MAJOR=1    # extra constexprs
"""
import collections
import os
import re
import subprocess
import sys
import tempfile

import triton
import triton.backends.nvidia as nvidia
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ddtree_kernels.fit import _ALIGNED, _PREFIX_SIG
from ddtree_kernels.prefix import prefix_split_kernel as fn

bm, bn, warps, stages = map(int, sys.argv[1:5])
sig = {k: ("*bf16" if v == "*KV" else v) for k, v in _PREFIX_SIG.items()}
const = dict(H=8, D_V=512, D_R=64, BLOCK_DV=512, BLOCK_DR=64, BLOCK_M=bm, BLOCK_N=bn, V_FROM_K=True,
             SCALE_FROM_PTR=False, WIDEN_TO_FP16=False, DOT_FP32=False, PREFETCH_L2=True, USE_PDL=True,
             KEYS_MAJOR=False)
const.update({k: int(v) for k, v in (a.split("=") for a in sys.argv[5:])})
full = {n: sig.get(n, "constexpr") for n in fn.arg_names}
attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in sig if a in _ALIGNED}
compiled = triton.compile(ASTSource(fn, full, const, attrs), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": warps, "num_stages": stages})
tool = os.path.join(os.path.dirname(nvidia.__file__), "bin", "cuobjdump")
with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
    f.write(compiled.asm["cubin"])
    f.flush()
    sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout
ins = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
for addr, text in ins:
    m = re.search(r"BRA\s+0x([0-9a-f]+)", text)
    if m and int(m.group(1), 16) < addr and addr - int(m.group(1), 16) > 1000:  # the key loop, not the prefetch loop
        body = [t for a, t in ins if int(m.group(1), 16) <= a <= addr]
        ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0] for t in body)
        print(f"Triton {triton.__version__}, {bm}x{bn}x{warps}x{stages}: key loop {len(body)} instructions a warp")
        print(" ".join(f"{k}:{v}" for k, v in ops.most_common(26)))
