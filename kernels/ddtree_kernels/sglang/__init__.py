"""What the SGLang patches (patches/) call into: the tree-aware mask policy and the verify routing.

Nothing here imports SGLang at import time; the patched SGLang modules pass in what
they have (class names, the TritonAttnBackend class), so one package serves every
SGLang release the patches support.

Deployment switches (environment variables, read when SGLang builds its backends):
  DDTREE_VERIFY_KERNEL   ddtree (default) | sglang   which kernel serves TARGET_VERIFY
  DDTREE_TREE_VERIFY     auto (default) | 1 | 0      is the verify a tree? auto: yes when the
                                                     server runs --speculative-algorithm DDTREE
  DDTREE_MASK_CAPABLE_BACKENDS  extra comma-separated backend class names that take a tree mask
"""

from .mask_policy import TreeVerifyBackendError, is_tree_verify, tree_aware_mask_policy
from .triton_backend import DDTREE_BACKEND_NAME, make_triton_backend, verify_kernel_choice

__all__ = [
    "DDTREE_BACKEND_NAME",
    "TreeVerifyBackendError",
    "is_tree_verify",
    "make_triton_backend",
    "tree_aware_mask_policy",
    "verify_kernel_choice",
]
