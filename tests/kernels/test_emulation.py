"""sm_120 emulation: plans made for capability 12.0 with the host GPU's SM count, and the projection's model."""

from __future__ import annotations

import pytest
import torch

from ddtree_kernels import launcher
from ddtree_kernels.configs import config_for
from ddtree_tools.bench import RTX_PRO_6000, Case, projection


class FakeGpu:
    """A CUDA device whose facts the test sets (planning reads nothing else of it)."""

    value: tuple = ((9, 0), 132)

    def set(self, capability: tuple[int, int], sm_count: int) -> None:
        self.value = (capability, sm_count)
        launcher.plan_verify.cache_clear()  # plans are cached per shape: a real GPU never changes


@pytest.fixture
def fake_gpu(monkeypatch):
    session = launcher._EMULATED_CAPABILITY  # a GPU suite run under EMULATE=sm120 keeps its own
    launcher.emulate_capability(None)
    gpu = FakeGpu()
    monkeypatch.setattr(launcher, "_real_device_facts", lambda device: gpu.value)
    yield gpu
    monkeypatch.undo()
    launcher.emulate_capability(session)


def _plan(**kw):
    return launcher.plan_verify(1, 8, 9, 9, "cuda", **kw)


def test_emulated_plan_is_the_sm120_plan_on_this_gpus_sms(fake_gpu):
    fake_gpu.set((12, 0), 132)  # an sm_120 GPU with the H200's SM count
    sm120 = _plan()
    fake_gpu.set((9, 0), 132)  # the H200 itself
    hopper = _plan()
    launcher.emulate_capability((12, 0))
    emulated = _plan()
    assert emulated == sm120 and emulated.config == config_for((12, 0)) and not emulated.gluon
    assert hopper.config == config_for((9, 0)) != emulated.config
    launcher.emulate_capability(None)
    assert _plan() == hopper  # undone, and the plan cache with it


def test_emulation_keeps_the_gpus_sm_count(fake_gpu):
    launcher.emulate_capability((12, 0))
    fake_gpu.set((9, 0), 132)
    on_h200 = _plan()
    fake_gpu.set((9, 0), 188)
    assert _plan().num_splits != on_h200.num_splits


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
