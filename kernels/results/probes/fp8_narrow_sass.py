"""Session 15, no GPU and no torch: registers, stack and an opcode histogram (and the LDS widths) of the fp8 keys-major
form (decode: prefix_wide_hopper_kernel with BLOCK_M 0, TAIL_N 8, an fp8 cache, 4 warps) of a package folder, compiled
for sm_90 by the running Triton. Written to see why the value operand loaded as contiguous bytes (session 14's vonly)
measured slower under Triton 3.6. Session 16 added the key loop's own count and histogram (the longest backward
branch's body), the figures the sweep log gives for the value operand's matrix loads:

    /path/to/triton36-venv/bin/python kernels/results/probes/fp8_narrow_sass.py kernels/ddtree_kernels
"""
import collections
import importlib
import os
import re
import subprocess
import sys
import tempfile
import types

pkg = types.ModuleType("ddk")
pkg.__path__ = [sys.argv[1]]
sys.modules["ddk"] = pkg  # the package's __init__ imports torch; its kernel modules do not
fn = importlib.import_module("ddk.prefix_hopper").prefix_wide_hopper_kernel

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402

TYPES = {"k_scale": "fp32", "v_scale": "fp32", "qk_scale_log2": "fp32", "kv_indices": "*i64", "qo_indptr": "*i32",
         "kv_indptr": "*i32", "O_part": "*fp32", "LSE_part": "*fp32", "Q": "*bf16", "K_buf": "*fp8e4nv"}
const = dict(H=8, D_V=512, D_R=64, BLOCK_M=0, BLOCK_N=64, NUM_STAGES=2, TAIL_N=8, KV_FP8=True, SCALE_FROM_PTR=False,
             USE_PDL=True, num_warps=4)
sig = {name: "constexpr" if name in const else TYPES.get(name, "i32") for name in fn.arg_names}
aligned = ("Q", "K_buf", "kv_indices", "qo_indptr", "kv_indptr", "O_part", "LSE_part", "stride_qt", "stride_qh",
           "stride_ks", "stride_or", "stride_op")
attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned}
kernel = triton.compile(GluonASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                        options={"num_warps": 4, "num_stages": 1})
tools = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin")
with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
    cubin.write(kernel.asm["cubin"])
    cubin.flush()
    sass = subprocess.run([os.path.join(tools, "cuobjdump"), "-sass", cubin.name], capture_output=True, text=True,
                          check=True).stdout
    usage = subprocess.run([os.path.join(tools, "cuobjdump"), "--dump-resource-usage", cubin.name],
                           capture_output=True, text=True, check=True).stdout
opcodes = [m.group(1) for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", sass)]
by_op = collections.Counter(op.split(".")[0] for op in opcodes)
print(f"Triton {triton.__version__}: {' '.join(re.findall(r'REG:[0-9]+|STACK:[0-9]+', usage))}, "
      f"{len(opcodes)} instructions")
print("  " + ", ".join(f"{op} {n}" for op, n in by_op.most_common(14)))
print("  loads: " + ", ".join(f"{op} {n}" for op, n in sorted(collections.Counter(
    op for op in opcodes if op.startswith("LDS")).items())))
# The key loop: the body of the longest backward branch (one key tile a trip).
body = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)([^;]*);")
instructions = [(int(a, 16), op, rest) for a, op, rest in body.findall(sass)]
back = [(addr, int(m.group(1), 16)) for addr, op, rest in instructions if op == "BRA"
        for m in [re.search(r"0x([0-9a-f]+)", rest)] if m and int(m.group(1), 16) < addr]
end, start = max(back, key=lambda b: b[0] - b[1])
loop = [op for addr, op, _ in instructions if start <= addr <= end]
print(f"  key loop: {len(loop)} instructions a trip; " + ", ".join(
    f"{op} {n}" for op, n in collections.Counter(loop).most_common(12)))
