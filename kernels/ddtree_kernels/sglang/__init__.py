"""Everything that knows SGLang: what the patches (patches/) call into, and nothing the kernel core imports.

- `adapter.py`: `sglang_verify_fwd`, SGLang's TARGET_VERIFY hook, and `unsupported_reason`.
- `triton_backend.py`: `DDTreeTritonAttnBackend`, the TritonAttnBackend subclass that routes the hook to our
  kernels; `verify_config.py`: the configuration it reads once when built.
- `mask_policy.py`: the tree-aware verify mask policy; `verify_stats.py`: declined calls logged and counted.
- `flat_mask.py`, `kv_indices.py`: SGLang's flat verify mask and its KV index list, written on the GPU.
- `selfcheck.py`: the deploy's kernel self-check, through the hook, against the float64 reference.
- `dsa_verify.py`: a DSA model's (GLM-5's) TARGET_VERIFY: the indexer's staged queries ranked and attended (0007).

Nothing here imports SGLang at import time; the patched SGLang modules pass in what they have (class names, the
TritonAttnBackend class), so one package serves every SGLang release the patches support.

Deployment switches (environment variables, read when SGLang builds its backends):
  DDTREE_VERIFY_KERNEL   ddtree (default) | sglang   which kernel serves TARGET_VERIFY
  DDTREE_TREE_VERIFY     auto (default) | 1 | 0      is the verify a tree? auto: yes when the
                                                     server runs --speculative-algorithm DDTREE
  DDTREE_MASK_CAPABLE_BACKENDS  extra comma-separated backend class names that take a tree mask
"""

from .adapter import sglang_verify_fwd, unsupported_reason
from .kv_indices import replaces_kv_fill
from .mask_policy import TreeVerifyBackendError, is_tree_verify, tree_aware_mask_policy
from .triton_backend import DDTREE_BACKEND_NAME, make_triton_backend, verify_kernel_choice
from .verify_config import VerifyConfig, verify_width

__all__ = [
    "DDTREE_BACKEND_NAME",
    "TreeVerifyBackendError",
    "VerifyConfig",
    "is_tree_verify",
    "make_triton_backend",
    "replaces_kv_fill",
    "sglang_verify_fwd",
    "tree_aware_mask_policy",
    "unsupported_reason",
    "verify_kernel_choice",
    "verify_width",
]
