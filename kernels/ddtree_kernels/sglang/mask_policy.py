"""Tree-aware replacement for the last line of SGLang's `resolve_dflash_verify_mask_policy`.

SGLang decides whether DFlash verify builds a custom attention mask from the verify
backend's class name alone (`_DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS`), and freezes the
decision into the captured CUDA graph. For a chain that is right; for a tree it silently
verifies the tree as a chain. So: a chain keeps SGLang's answer; a tree always builds the
mask, and a backend that cannot take one is refused at start-up, naming the fix.
"""

from __future__ import annotations

import os
import sys

from .triton_backend import DDTREE_BACKEND_NAME

# Backends on SGLang's skip list that nevertheless take a custom tree mask in TARGET_VERIFY.
TREE_MASK_CAPABLE = frozenset({"TritonAttnBackend", DDTREE_BACKEND_NAME})
_TREE_ALGORITHMS = frozenset({"DDTREE"})


class TreeVerifyBackendError(RuntimeError):
    """A tree verify was asked of an attention backend that cannot apply a tree mask."""


def _argv_algorithm(argv: list[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg == "--speculative-algorithm" and i + 1 < len(argv):
            return argv[i + 1].upper()
        if arg.startswith("--speculative-algorithm="):
            return arg.split("=", 1)[1].upper()
    return None


def is_tree_verify(argv: list[str] | None = None) -> bool:
    """True when verify runs on a draft tree: DDTREE_TREE_VERIFY, else the server's own arguments.

    SGLang's scheduler processes are spawned with the parent's sys.argv, so the
    command-line algorithm is visible in every process on every release.
    """
    setting = os.environ.get("DDTREE_TREE_VERIFY", "auto").strip().lower()
    if setting in ("1", "true", "yes"):
        return True
    if setting in ("0", "false", "no"):
        return False
    if setting != "auto":
        raise ValueError(f"DDTREE_TREE_VERIFY={setting!r}: use auto, 1 or 0")
    return _argv_algorithm(sys.argv if argv is None else argv) in _TREE_ALGORITHMS


def mask_capable_backends() -> frozenset[str]:
    extra = os.environ.get("DDTREE_MASK_CAPABLE_BACKENDS", "")
    return TREE_MASK_CAPABLE | {name.strip() for name in extra.split(",") if name.strip()}


def tree_aware_mask_policy(backend_name: str, skip_custom_mask: frozenset[str]) -> tuple[str, bool]:
    """(backend_name, build_custom_mask), as `resolve_dflash_verify_mask_policy` returns it."""
    # Our Triton subclass expresses a chain through the causal path exactly like Triton.
    chain_answer = backend_name not in skip_custom_mask and backend_name != DDTREE_BACKEND_NAME
    if not is_tree_verify():
        return backend_name, chain_answer
    if backend_name in skip_custom_mask and backend_name not in mask_capable_backends():
        raise TreeVerifyBackendError(
            f"tree verify (DDTree) needs an attention backend that applies a custom tree mask, but the "
            f"verify backend is {backend_name}, which SGLang runs without one: the tree would be verified "
            f"as a chain and produce wrong tokens. Start the server with --attention-backend triton "
            f"(DDTree's backend), or set DDTREE_MASK_CAPABLE_BACKENDS={backend_name} if this backend does "
            f"take the mask, or DDTREE_TREE_VERIFY=0 if this verify is not a tree."
        )
    return backend_name, True
