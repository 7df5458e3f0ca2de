"""The two distributions depend one way: ddtree-ops (the deploy tooling) imports ddtree_kernels, never the
reverse, so the kernel wheel a GPU host installs, and its tools, stand alone."""

from __future__ import annotations

import ast
from pathlib import Path

KERNELS = Path(__file__).resolve().parents[2] / "kernels"


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_the_kernel_distribution_imports_nothing_of_ddtree_ops():
    files = [p for pkg in ("ddtree_kernels", "ddtree_tools") for p in (KERNELS / pkg).rglob("*.py")]
    assert len(files) > 20
    offenders = sorted(str(p.relative_to(KERNELS)) for p in files if "ddtree_ops" in _imported_roots(p))
    assert offenders == []
