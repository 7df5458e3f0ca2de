"""Import SGLang modules on a machine without SGLang's GPU build: stand in the modules they import.

Used by the patched-source checks of the release job (ddtree_ops.patched_checks) and by the tests' SGLang
protocol models.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator


def put(mapping: dict, key: str, value: object) -> None:
    """mapping[key] = value, or remove key when value is None (restores 'was not there')."""
    if value is None:
        mapping.pop(key, None)
    else:
        mapping[key] = value


@contextlib.contextmanager
def stand_in_modules(modules: dict[str, dict]) -> Iterator[None]:
    """Temporarily register modules (and their parent packages) with the given attributes."""
    saved = {}
    names = set()
    for full in modules:
        parts = full.split(".")
        names.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    for name in sorted(names):
        saved[name] = sys.modules.get(name)
        mod = types.ModuleType(name)
        mod.__path__ = []
        mod.__dict__.update(modules.get(name, {}))
        sys.modules[name] = mod
    try:
        yield
    finally:
        for name, old in saved.items():
            put(sys.modules, name, old)
