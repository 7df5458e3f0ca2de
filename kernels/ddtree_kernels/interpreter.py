"""Whether kernels run through Triton's interpreter (TRITON_INTERPRET=1: on the CPU, through numpy)."""

import os


def interpreting() -> bool:
    """True under TRITON_INTERPRET=1, where kernels run on the CPU and no PTX is built."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
