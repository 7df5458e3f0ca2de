"""Session 15, no GPU and no torch: shared memory, registers and stack (spills) of every Gluon prefix kernel variant
of a package folder, compiled for sm_90 by the running Triton (triton.compile, then cuobjdump --dump-resource-usage),
so a Triton 3.6 virtual environment without torch gives the same figures as `python -m ddtree_kernels.fit` under
Triton 3.6 on the GPU machine (checked against results/fit-triton36.txt of commit 3b47ead):

    /path/to/triton36-venv/bin/python kernels/results/probes/gluon_resources.py kernels/ddtree_kernels
"""
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
prefix_hopper = importlib.import_module("ddk.prefix_hopper")
prefix_hopper_ws = importlib.import_module("ddk.prefix_hopper_ws")

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402

BIN = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin")
ALIGNED = ("Q", "K_buf", "kv_indices", "qo_indptr", "kv_indptr", "O_part", "LSE_part", "stride_qt", "stride_qh",
           "stride_ks", "stride_or", "stride_op")
SCALARS = {"k_scale": "fp32", "v_scale": "fp32", "qk_scale_log2": "fp32", "kv_indices": "*i64", "qo_indptr": "*i32",
           "kv_indptr": "*i32", "O_part": "*fp32", "LSE_part": "*fp32", "Q": "*bf16"}
# (kernel, BLOCK_M, TAIL_N, cache dtype, warps, stages): configs.HOPPER's Gluon tiles, as fit._variants lists them
VARIANTS = [
    (prefix_hopper.prefix_wide_hopper_kernel, 64, 0, "bf16", 8, 2),
    (prefix_hopper.prefix_wide_hopper_kernel, 64, 8, "bf16", 8, 2),
    (prefix_hopper.prefix_wide_hopper_kernel, 64, 0, "fp8e4nv", 8, 2),
    (prefix_hopper.prefix_wide_hopper_kernel, 64, 8, "fp8e4nv", 8, 2),
    (prefix_hopper.prefix_wide_hopper_kernel, 0, 8, "bf16", 4, 2),
    (prefix_hopper.prefix_wide_hopper_kernel, 0, 16, "bf16", 4, 2),
    (prefix_hopper.prefix_wide_hopper_kernel, 0, 8, "fp8e4nv", 4, 2),
    (prefix_hopper.prefix_wide_hopper_kernel, 0, 16, "fp8e4nv", 4, 2),
    (prefix_hopper_ws.prefix_wide_ws_kernel, 64, 8, "bf16", prefix_hopper_ws.KERNEL_WARPS, 2),
]
for fn, block_m, tail, kv, warps, stages in VARIANTS:
    sig = {name: SCALARS.get(name, "i32") for name in fn.arg_names}
    sig["K_buf"] = "*" + kv
    const = dict(H=8, D_V=512, D_R=64, BLOCK_M=block_m, BLOCK_N=64, NUM_STAGES=stages, TAIL_N=tail,
                 KV_FP8=kv != "bf16", SCALE_FROM_PTR=False, USE_PDL=True, num_warps=warps)
    for name in const:
        sig[name] = "constexpr"
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in ALIGNED}
    kernel = triton.compile(GluonASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": warps, "num_stages": 1})
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(kernel.asm["cubin"])
        cubin.flush()
        usage = subprocess.run([os.path.join(BIN, "cuobjdump"), "--dump-resource-usage", cubin.name],
                               capture_output=True, text=True, check=True).stdout
    regs, stack = (int(re.search(rf"{key}:(\d+)", usage).group(1)) for key in ("REG", "STACK"))
    print(f"{fn.__name__:28} BLOCK_M {block_m:2} TAIL_N {tail:2} {kv:8} shared {kernel.metadata.shared:7} "
          f"registers {regs:3} stack {stack:3} (Triton {triton.__version__})")
