"""Test session setup: run Triton kernels through the interpreter when there is no GPU.

TRITON_INTERPRET must be set before triton is first imported (it decides at
@triton.jit time), so this happens here, before any test module loads.
"""

import os

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

# DDTREE_EMULATE=sm120 (make test-gpu EMULATE=sm120): the GPU suite on the sm_120 path: its tests plan for
# Target.emulating("sm120", "cuda") (tests/kernels/cases.TARGET), every dot on mma.sync (DISABLE_MMA_V3, read
# when Triton compiles).
EMULATE = os.environ.get("DDTREE_EMULATE", "")
if EMULATE:
    from ddtree_kernels.target import NAMED

    if EMULATE not in NAMED:
        raise ValueError(f"DDTREE_EMULATE={EMULATE!r}: choose one of {', '.join(NAMED)}")
    os.environ["DISABLE_MMA_V3"] = "1"
