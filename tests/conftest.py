"""Test session setup: run Triton kernels through the interpreter when there is no GPU.

TRITON_INTERPRET must be set before triton is first imported (it decides at
@triton.jit time), so this happens here, before any test module loads.
"""

import os

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

# DDTREE_EMULATE=sm120 (make test-gpu EMULATE=sm120): the GPU suite on the sm_120 path, plans for
# compute capability 12.0 and every dot on mma.sync (DISABLE_MMA_V3, read when Triton compiles).
EMULATE = os.environ.get("DDTREE_EMULATE", "")
if EMULATE:
    os.environ["DISABLE_MMA_V3"] = "1"
    from ddtree_kernels.launcher import emulate_capability
    from ddtree_tools.bench import EMULATIONS

    if EMULATE not in EMULATIONS:
        raise ValueError(f"DDTREE_EMULATE={EMULATE!r}: choose one of {', '.join(EMULATIONS)}")
    emulate_capability(EMULATIONS[EMULATE])
