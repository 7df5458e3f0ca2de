"""Real SGLang sources for the patch tests: the wheels of the releases the issue names."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from ddtree_ops.wheels import sglang_wheel, unpack_sources

RELEASES = ["0.5.14", "0.5.18", "0.5.20", "0.5.22", "0.5.23"]


@pytest.fixture
def pristine(tmp_path):
    """pristine(version) -> a fresh folder holding that release's sglang/ sources (wheel layout)."""

    def make(version: str) -> Path:
        return unpack_sources(sglang_wheel(version), tmp_path / f"sglang-{version}")

    return make


def tree_hashes(root: Path) -> dict[str, str]:
    """sha256 of every file under root (relative path -> digest), .git excluded.

    .git is pruned before it is walked: git may repack its objects in the background meanwhile."""
    out = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != ".git"]
        for name in files:
            path = Path(folder) / name
            out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return dict(sorted(out.items()))
