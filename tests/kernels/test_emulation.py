"""sm_120 emulation: plans made for sm_120's table with the host GPU's SM count, and the projection's model."""

from __future__ import annotations

import pytest
import torch

from ddtree_kernels.launcher import plan_verify
from ddtree_kernels.target import Target
from ddtree_tools.bench import RTX_PRO_6000, Case, projection


def test_an_emulated_target_is_sm120_with_this_gpus_sms():
    h200 = Target((9, 0), 132, True)
    emulated = Target.named("sm120", sms=h200.sms, gluon=h200.gluon)
    sm120 = plan_verify(1, 8, 9, 9, emulated)
    assert sm120.table.name == "sm120" and sm120.target.sms == 132
    assert plan_verify(1, 8, 9, 9, h200).table.name == "sm90"
    assert sm120.num_splits != plan_verify(1, 8, 9, 9, Target.named("sm120")).num_splits  # 132 SMs, not 188


def test_emulating_needs_a_gpu():
    if torch.cuda.is_available():
        target = Target.emulating("sm120", "cuda")
        assert target.capability == (12, 0) and target.sms == Target.detect("cuda").sms
    else:
        with pytest.raises(ValueError, match="needs a CUDA device"):
            Target.emulating("sm120", "cpu")
    with pytest.raises(ValueError, match="unknown GPU 'sm100'"):
        Target.named("sm100")


def test_projection_model():
    case = Case(1, 185000, 8, 9)
    # memory-bound there: bytes at 1,792 GB/s
    fast = projection(case, measured_us=80.0, mma_tflops=410.0)
    assert fast == pytest.approx(case.kv_bytes() / RTX_PRO_6000["gbs"] / 1e3)
    # compute-bound there: at the fraction of the mma.sync ceiling reached here, on 458 TFLOP/s
    slow = projection(case, measured_us=476.0, mma_tflops=410.0)
    reached = case.flops() / 476.0 / 1e6 / 410.0
    assert slow == pytest.approx(case.flops() / (458.0 * reached) / 1e6) and slow > fast
    assert torch.isclose(torch.tensor(slow), torch.tensor(476.0 * 410.0 / 458.0))
