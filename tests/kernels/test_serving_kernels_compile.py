"""The backend's two serving kernels (KV index fill, flat mask for a declined call) compile for sm_120 and sm_90.

Compiled offline in a child process (the real Triton JIT; this session may run under TRITON_INTERPRET=1), as
test_fit does for the verify kernels; their results are checked under the interpreter or on the GPU by
test_kv_indices.py and test_visibility_feed.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

COMPILE = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from ddtree_kernels.sglang import flat_mask, kv_indices

kernels = {
    "kv_indices": (kv_indices._kv_indices_kernel,
                   dict(req_to_token="*i32", req_pool_indices="*i64", seq_lens="*i64", kv_indptr="*i32",
                        kv_indices="*i64", row_stride="i32"),
                   dict(BLOCK=kv_indices.BLOCK, PROGRAMS=kv_indices.PROGRAMS)),
    "flat_mask": (flat_mask._flat_mask_kernel,
                  dict(vis="*u8", vis_row_stride="i32", qo_indptr="*i32", kv_indptr="*i32", mask_indptr="*i64",
                       out="*i8"),
                  dict(BLOCK=flat_mask._BLOCK)),
}
out = {}
for cap in (120, 90):
    for name, (fn, sig, const) in kernels.items():
        full = {a: sig.get(a, "constexpr") for a in fn.arg_names}
        compiled = triton.compile(ASTSource(fn, full, const), target=GPUTarget("cuda", cap, 32),
                                  options={"num_warps": 4})
        ptx = compiled.asm["ptx"]
        out[f"{name}@sm_{cap}"] = {"shared": compiled.metadata.shared, "ptx_bytes": len(ptx),
                                   "hopper_only": sum(ptx.count(op) for op in ("wgmma.", "setmaxnreg", "tcgen05"))}
json.dump(out, sys.stdout)
"""


@pytest.fixture(scope="module")
def compiled() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    kernels = str(Path(__file__).resolve().parents[2] / "kernels")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [kernels, env.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", COMPILE], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.parametrize("name", ["kv_indices", "flat_mask"])
@pytest.mark.parametrize("target", ["sm_120", "sm_90"])
def test_compiles_with_no_hopper_only_instructions(compiled, name, target):
    got = compiled[f"{name}@{target}"]
    assert got["ptx_bytes"] > 0 and got["hopper_only"] == 0, got
    assert got["shared"] <= 101_376, got  # sm_120's shared memory a block
