"""Session 10, no GPU: does a warp-specialized Gluon kernel of the shape the next GLM-5 tile needs compile
for sm_90 on both Triton releases the Gluon kernel supports (3.6 and 3.9)? Two consumer warpgroups with
code of their own (each scores its own 64-key tile against the 64 query rows: the "one warpgroup's
softmax beside the other's wgmmas" schedule) and a producer warpgroup that gathers the key rows by
slot with cp.async into two stages, handing them over with mbarriers. It prints registers, spills,
shared memory and the SASS opcodes that show the partitions (HGMMA, SYNCS, setmaxnreg). Not a kernel the
launcher runs; nothing here is checked against a reference.

    python kernels/results/probes/ws_skeleton.py            # with Triton alone (no torch), e.g. Triton 3.6
"""
import collections
import os
import re
import subprocess
import tempfile

import triton
import triton.backends.nvidia as nvidia
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.language.nvidia.hopper import (
    async_copy,
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

_async_gather = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared

ROWS = gl.constexpr(64)
KEYS = gl.constexpr(64)
D_V = gl.constexpr(512)  # the latent columns (values are the keys' first 512)
D_R = gl.constexpr(64)  # the rope columns, a buffer of their own (shapes are powers of two)


@gluon.jit
def _consumer(qn_smem, qr_smem, kn_smem, kr_smem, ready, empty, Out, n_tiles, WHICH: gl.constexpr):
    """Tiles WHICH, WHICH + 2, ...: wait for the stage, score it (64 rows x 64 keys), release it, and keep
    each row's running maximum (a stand-in for the softmax that the other warpgroup's wgmmas would hide)."""
    S_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, KEYS, 16])
    m = gl.full([ROWS], float("-inf"), gl.float32, gl.SliceLayout(1, S_LAYOUT))
    zero = gl.zeros([ROWS, KEYS], gl.float32, S_LAYOUT)
    for i in range(WHICH, n_tiles, 2):
        mbarrier.wait(ready.index(WHICH), (i // 2) & 1)
        s = warpgroup_mma(qn_smem, kn_smem.index(WHICH).permute((1, 0)), zero, use_acc=False, is_async=True)
        s = warpgroup_mma(qr_smem, kr_smem.index(WHICH).permute((1, 0)), s, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        mbarrier.arrive(empty.index(WHICH), count=1)
        m = gl.maximum(m, gl.max(s, 1))
    rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, S_LAYOUT))
    gl.store(Out + WHICH * ROWS + rows, m)


@gluon.jit
def _producer(kn_smem, kr_smem, ready, empty, K_buf, kv_indices, n_tiles, stride_ks):
    """Gather tile i's key rows (by slot) into stage i % 2 once its consumer has released it; each thread's
    copies arrive on the stage's `ready` barrier when they land (cp.async.mbarrier.arrive.noinc)."""
    N_LAYOUT: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[2, 16], warps_per_cta=[4, 1],
                                              order=[1, 0])
    R_LAYOUT: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[4, 8], warps_per_cta=[4, 1],
                                              order=[1, 0])
    cols_n = gl.arange(0, D_V, layout=gl.SliceLayout(0, N_LAYOUT))
    cols_r = D_V + gl.arange(0, D_R, layout=gl.SliceLayout(0, R_LAYOUT))
    for i in range(n_tiles):
        stage = i % 2
        mbarrier.wait(empty.index(stage), ((i // 2) & 1) ^ 1, pred=i >= 2)
        slot_n = gl.load(kv_indices + i * KEYS + gl.arange(0, KEYS, layout=gl.SliceLayout(1, N_LAYOUT))).to(gl.int64)
        slot_r = gl.load(kv_indices + i * KEYS + gl.arange(0, KEYS, layout=gl.SliceLayout(1, R_LAYOUT))).to(gl.int64)
        _async_gather(kn_smem.index(stage), K_buf + slot_n[:, None] * stride_ks + cols_n[None, :])
        _async_gather(kr_smem.index(stage), K_buf + slot_r[:, None] * stride_ks + cols_r[None, :])
        async_copy.mbarrier_arrive(ready.index(stage), increment_count=False)


@gluon.jit
def ws_seesaw_skeleton(Q, K_buf, kv_indices, Out, n_tiles, stride_ks, num_warps: gl.constexpr):
    Q_LAYOUT: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[1, 32],
                                              warps_per_cta=[num_warps, 1], order=[1, 0])
    N_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, D_V], gl.bfloat16)
    R_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, D_R], gl.bfloat16)
    qn_smem = gl.allocate_shared_memory(gl.bfloat16, [ROWS, D_V], N_SMEM)
    qr_smem = gl.allocate_shared_memory(gl.bfloat16, [ROWS, D_R], R_SMEM)
    kn_smem = gl.allocate_shared_memory(gl.bfloat16, [2, KEYS, D_V], N_SMEM)
    kr_smem = gl.allocate_shared_memory(gl.bfloat16, [2, KEYS, D_R], R_SMEM)
    ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(2):
        mbarrier.init(ready.index(s), count=128)  # every producer thread's copies
        mbarrier.init(empty.index(s), count=1)
    rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, Q_LAYOUT))
    cols = gl.arange(0, D_V, layout=gl.SliceLayout(0, Q_LAYOUT))
    qn_smem.store(gl.load(Q + rows[:, None] * (D_V + D_R) + cols[None, :]))
    cols_r = gl.arange(0, D_R, layout=gl.SliceLayout(0, Q_LAYOUT))
    qr_smem.store(gl.load(Q + rows[:, None] * (D_V + D_R) + D_V + cols_r[None, :]))
    fence_async_shared()
    gl.warp_specialize([(_consumer, (qn_smem, qr_smem, kn_smem, kr_smem, ready, empty, Out, n_tiles, 0)),
                        (_consumer, (qn_smem, qr_smem, kn_smem, kr_smem, ready, empty, Out, n_tiles, 1)),
                        (_producer, (kn_smem, kr_smem, ready, empty, K_buf, kv_indices, n_tiles, stride_ks))],
                       [4, 4], [232, 40])


def main() -> None:
    fn = ws_seesaw_skeleton
    sig = dict(Q="*bf16", K_buf="*bf16", kv_indices="*i64", Out="*fp32", n_tiles="i32", stride_ks="i32")
    full = {n: sig.get(n, "constexpr") for n in fn.arg_names}
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in ("Q", "K_buf", "kv_indices", "Out",
                                                                            "stride_ks")}
    compiled = triton.compile(GluonASTSource(fn, full, dict(num_warps=4), attrs), target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": 4, "num_stages": 1})
    tool = os.path.join(os.path.dirname(nvidia.__file__), "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        usage = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", m.group(1)).split()[0].split(".")[0]
                              for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);", sass))
    print(f"Triton {triton.__version__}: shared {compiled.metadata.shared} B,",
          " ".join(re.findall(r"REG:\d+|STACK:\d+|LOCAL:\d+", usage)),
          f"warps {compiled.metadata.num_warps}, setmaxnreg {len(re.findall('setmaxnreg', compiled.asm['ptx']))}")
    print("  " + " ".join(f"{k}:{ops[k]}" for k in ("HGMMA", "LDGSTS", "SYNCS", "WARPGROUP", "BAR") if k in ops))


if __name__ == "__main__":
    main()
