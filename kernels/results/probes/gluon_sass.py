"""Session 7, no GPU: compile prefix_hopper's Gluon wide tile for sm_90 and print its registers, spills,
shared memory and the opcode histogram of its key loop(s) in SASS (the backward branches' bodies).

    python kernels/results/probes/gluon_sass.py 64 2 0     # BLOCK_N stages TAIL_N
    python kernels/results/probes/gluon_sass.py 64 2 8     # with the fused 8-row tail (two loops)
    python kernels/results/probes/gluon_sass.py 64 2 8 fp8 # an fp8 cache (session 8)

Loads prefix_hopper.py by path, so it runs in a venv with Triton alone (no torch), e.g. Triton 3.6.
"""
import collections
import importlib.util
import os
import re
import subprocess
import sys
import tempfile

import triton
import triton.backends.nvidia as nvidia
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("prefix_hopper", os.path.join(here, "../../ddtree_kernels/prefix_hopper.py"))
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
fn = module.prefix_wide_hopper_kernel

bn, stages, tail = (int(a) for a in sys.argv[1:4])
fp8 = sys.argv[4:5] == ["fp8"]
sig = dict(Q="*bf16", K_buf="*fp8e4nv" if fp8 else "*bf16", kv_indices="*i64", qo_indptr="*i32", kv_indptr="*i32",
           O_part="*fp32", LSE_part="*fp32", k_scale="fp32", v_scale="fp32", qk_scale_log2="fp32", min_chunk="i32", row_base="i32", row_stride="i32", stride_qt="i32", stride_qh="i32",
           stride_ks="i32", stride_or="i32", stride_op="i32", stride_lr="i32")
aligned = {"Q", "K_buf", "kv_indices", "qo_indptr", "kv_indptr", "O_part", "LSE_part", "stride_qt", "stride_qh",
           "stride_ks", "stride_or", "stride_op"}
const = dict(H=8, D_V=512, D_R=64, BLOCK_M=64, BLOCK_N=bn, NUM_STAGES=stages, TAIL_N=tail, KV_FP8=fp8,
             SCALE_FROM_PTR=False, USE_PDL=True, num_warps=8)
full = {n: sig.get(n, "constexpr") for n in fn.arg_names}
attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned}
compiled = triton.compile(GluonASTSource(fn, full, const, attrs), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": 8, "num_stages": 1})
tool = os.path.join(os.path.dirname(nvidia.__file__), "bin", "cuobjdump")
with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
    f.write(compiled.asm["cubin"])
    f.flush()
    usage = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
    sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout
print(f"Triton {triton.__version__}, BLOCK_N={bn} stages={stages} TAIL_N={tail}{' fp8' if fp8 else ''}: shared {compiled.metadata.shared} B",
      " ".join(re.findall(r"REG:\d+|STACK:\d+|LOCAL:\d+", usage)))
ins = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
for addr, text in ins:
    m = re.search(r"BRA\s+0x([0-9a-f]+)", text)
    if m and int(m.group(1), 16) < addr and addr - int(m.group(1), 16) > 1000:  # a key loop
        body = [t for a, t in ins if int(m.group(1), 16) <= a <= addr]
        ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0] for t in body)
        print(f"key loop: {len(body)} instructions a warp")
        print(" ".join(f"{k}:{v}" for k, v in ops.most_common(30)))
