"""The benchmark's timing helper: do_bench's L2 flush reads instead of writes, and only while timing.

Marked `gpu` (do_bench and its flush buffer need CUDA); `make test-gpu` runs it.
"""

from __future__ import annotations

import pytest
import torch
import triton

from ddtree_tools.bench import _read_flush, _time

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run with make test-gpu)"),
]


def test_flush_reads_while_timing_and_zeroes_again_after():
    driver = triton.runtime.driver.active
    buf = driver.get_empty_cache_for_benchmark()
    buf.fill_(7)
    with _read_flush():
        driver.clear_cache(buf)
        torch.cuda.synchronize()
        assert int(buf.min()) == 7 == int(buf.max())  # read, not overwritten
    driver.clear_cache(buf)  # do_bench's own flush is back
    torch.cuda.synchronize()
    assert int(buf.abs().max()) == 0


def test_time_returns_microseconds_and_restores_the_driver():
    x = torch.empty(1 << 26, dtype=torch.bfloat16, device="cuda")
    us = _time(lambda: x.mul_(1.0), rep_ms=20, warmup_ms=5)
    assert 1.0 < us < 10_000.0  # a 128 MB read + write: tens of µs, never ms-as-µs or s
    assert "clear_cache" not in vars(triton.runtime.driver.active)
