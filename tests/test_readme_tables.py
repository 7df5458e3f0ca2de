"""The module tables of kernels/README.md and ddtree_ops/README.md match the tree: every module of the package is
named in its README's table, and every module a table names exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"kernels/README.md": ROOT / "kernels" / "ddtree_kernels", "ddtree_ops/README.md": ROOT / "ddtree_ops"}


def _table(readme: Path) -> str:
    """The README's module table rows (lines starting with `|`), as one text."""
    return "\n".join(line for line in readme.read_text().splitlines() if line.startswith("| `"))


def _named(table: str) -> set[str]:
    return set(re.findall(r"`([\w/]+\.py)`", table))


@pytest.mark.parametrize("readme", sorted(PACKAGES))
def test_every_module_is_in_the_readme_table(readme):
    package, table = PACKAGES[readme], _table(ROOT / readme)
    named = _named(table)
    missing = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        if path.name == "__init__.py" or rel in named:
            continue
        # a folder's row may name its modules by file name alone (`dsa/`: `indexer.py`, ...)
        folder = f"`{path.parent.relative_to(package).as_posix()}/`"
        rows = [row for row in table.splitlines() if folder in row]
        if not any(f"`{path.name}`" in row for row in rows):
            missing.append(rel)
    assert not missing, f"{readme} names no row for {missing}"


@pytest.mark.parametrize("readme", sorted(PACKAGES))
def test_every_module_the_table_names_exists(readme):
    package, table = PACKAGES[readme], _table(ROOT / readme)
    names = {p.relative_to(package).as_posix() for p in package.rglob("*.py")} | {
        p.name for p in package.rglob("*.py")}
    assert not sorted(n for n in _named(table) if n not in names)
