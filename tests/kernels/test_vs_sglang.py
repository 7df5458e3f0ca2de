"""Our kernel against SGLang's own extend_attention_fwd (the path DDTree verify uses today).

SGLang's kernel is loaded from the real 0.5.23 wheel (ddtree_tools.sglang_wheel) and
run on the same inputs. Under the interpreter it gets fp32 copies (a bf16 tl.dot is
wrong there); the values are the same bf16-representable numbers ours sees.
"""

from __future__ import annotations

import pytest
import torch

from ddtree_kernels.sglang import sglang_verify_fwd
from ddtree_ops.wheels import sglang_wheel
from ddtree_tools.sglang_wheel import load_sglang_attention

from .cases import DEVICE, TARGET, make_case


@pytest.fixture(scope="module")
def sglang_extend():
    return load_sglang_attention(sglang_wheel("0.5.23"))["extend_attention"].extend_attention_fwd


@pytest.mark.parametrize("tree", ["random", "chain"])
def test_matches_sglang_extend_attention(sglang_extend, tree):
    case = make_case([300, 17, 0], [9, 4, 9], 2, DEVICE, tree=tree)
    ours = torch.full((22, 2, 512), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    assert sglang_verify_fwd(
        case.q, case.k_draft, case.v_draft, ours, case.k_cache, case.v_cache, case.qo_indptr, case.kv_indptr,
        case.kv_indices, case.custom_mask, True, case.mask_indptr, case.max_draft, 1.0, 1.0, case.sm_scale,
        target=TARGET,
    )
    theirs = torch.zeros(22, 2, 512, dtype=torch.float32, device=DEVICE)
    sglang_extend(
        case.q.float(), case.k_draft.float(), case.v_draft.float(), theirs, case.k_cache.float(),
        case.v_cache.float(), case.qo_indptr, case.kv_indptr, case.kv_indices, case.custom_mask, True,
        case.mask_indptr, case.max_draft, 1.0, 1.0, case.sm_scale,
    )
    ref, _ = case.reference()
    # SGLang on fp32 inputs is the definition: exact under the interpreter, TF32 dots on a GPU.
    assert ((theirs.double().cpu() - ref).norm() / ref.norm()).item() < 1e-3
    err = ((ours.double().cpu() - theirs.double().cpu()).norm() / theirs.double().cpu().norm()).item()
    assert err < 1e-2, f"ours vs SGLang: {err:.3e} (seed {case.seed})"


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_wheel_loader_reads_both_kernel_layouts(version):
    """0.5.14 keeps the kernels under srt/ (its extend kernel imports prefill_attention), 0.5.23 under
    kernels/ops; the stand-in runtime modules are gone once the files have imported."""
    import sys

    mods = load_sglang_attention(sglang_wheel(version))
    assert callable(mods["extend_attention"].extend_attention_fwd)
    assert "prefill_attention" in mods
    assert "sglang.srt.environ" not in sys.modules and "sglang" not in sys.modules
