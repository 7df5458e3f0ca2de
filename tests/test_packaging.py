"""The wheels the deployment installs carry every module (editable installs would hide a gap)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _build(project: str, out: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), f"./{project}"],
                   cwd=ROOT, check=True, capture_output=True)
    return next(out.glob("*.whl"))


def test_kernel_wheel_has_every_module(tmp_path):
    wheel = _build("kernels", tmp_path)
    assert wheel.name.startswith("ddtree_kernels-")
    names = set(zipfile.ZipFile(wheel).namelist())
    source = {str(p.relative_to(ROOT / "kernels")) for p in (ROOT / "kernels" / "ddtree_kernels").rglob("*.py")}
    assert source <= names, sorted(source - names)
    assert "ddtree_kernels/sglang/backend.py" in names  # what the SGLang patches import


def test_ops_wheel_has_every_module(tmp_path):
    wheel = _build(".", tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    source = {str(p.relative_to(ROOT)) for p in (ROOT / "ddtree_ops").rglob("*.py")}
    assert source <= names, sorted(source - names)
