"""The wheels the deployment installs carry every module (editable installs would hide a gap), and nothing else:
no test machinery (test hosts, their watchdog, stand-ins) goes onto a production host."""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

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
    assert "ddtree_kernels/sglang/triton_backend.py" in names  # what the SGLang patches import
    assert not [n for n in names if n.startswith("ddtree_tools/")]  # bench, fit, sweep stay off the hosts


def test_ops_wheel_has_every_module(tmp_path):
    wheel = _build(".", tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    source = {str(p.relative_to(ROOT)) for p in (ROOT / "ddtree_ops").rglob("*.py")}
    assert source <= names, sorted(source - names)


# What only tests use: it lives under tests/ and must never be found in a wheel.
TEST_MACHINERY = ("testhost", "restart_watchdog", "standin", "stand_in_server", "conftest", "test_")


def _test_machinery(names: set[str]) -> list[str]:
    return sorted(n for n in names if n.endswith(".py") and any(Path(n).name.startswith(t) for t in TEST_MACHINERY))


def test_wheels_hold_runtime_code_only(tmp_path):
    kernel = set(zipfile.ZipFile(_build("kernels", tmp_path / "k")).namelist())
    ops = set(zipfile.ZipFile(_build(".", tmp_path / "o")).namelist())
    assert not _test_machinery(kernel) and not _test_machinery(ops), (_test_machinery(kernel), _test_machinery(ops))
    assert not [n for n in kernel | ops if n.startswith("tests/")]
    # the check can fail: the test hosts' module, were it in a package, is caught
    assert _test_machinery({"ddtree_ops/testhost.py", "ddtree_ops/cli.py"}) == ["ddtree_ops/testhost.py"]


def _third_party_imports(package: Path) -> set[str]:
    """Top-level modules the package imports (anywhere, lazily too), less the standard library and itself."""
    found = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return {m for m in found if m not in sys.stdlib_module_names and m not in {package.name, "__future__"}}


def test_ops_declares_every_package_it_imports():
    """ddtree-ops imports nothing it does not declare (base requirements or an extra), SGLang and the
    transformers it pins aside: the patch tool, the launch check and the model view run inside the release
    venv, next to the SGLang they serve (the model view loads configs with SGLang's transformers, if any)."""
    declared = {canonicalize_name(Requirement(r).name) for r in metadata.requires("ddtree-ops") or []}
    owners = metadata.packages_distributions()
    missing = {}
    for module in _third_party_imports(ROOT / "ddtree_ops") - {"sglang", "transformers", "tomli"}:
        dists = {canonicalize_name(d) for d in owners.get(module, [module])}
        if not dists & declared:
            missing[module] = sorted(dists)
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"
