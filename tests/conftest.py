"""Test session setup: run Triton kernels through the interpreter when there is no GPU.

TRITON_INTERPRET must be set before triton is first imported (it decides at
@triton.jit time), so this happens here, before any test module loads.
"""

import os

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
