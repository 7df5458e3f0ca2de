"""Tree-verify attention kernels for MLA models (DDTree speculative decoding).

Public API:
  tree_verify_attention  standalone call with a compact tree mask
  plan_verify, run_verify, Workspace, reserve_workspace   plan/run split for CUDA graphs
  reference.tree_verify_reference                       float64 torch reference
  masks                                                 parent arrays <-> visibility <-> SGLang flat masks

SGLang's verify hook and backend live in `ddtree_kernels.sglang` (`sglang_verify_fwd`), the one place that
knows SGLang; nothing in this package imports it.
"""

from . import masks, reference
from .api import tree_verify_attention
from .launcher import VerifyPlan, Workspace, plan_verify, reserve_workspace, run_verify
from .target import Target

__version__ = "0.1.0"

__all__ = [
    "Target",
    "VerifyPlan",
    "Workspace",
    "masks",
    "plan_verify",
    "reference",
    "reserve_workspace",
    "run_verify",
    "tree_verify_attention",
    "__version__",
]
