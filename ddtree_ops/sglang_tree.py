"""Find the SGLang source a patch targets and the release it is.

Targets: a site-packages directory (or an unpacked wheel) holding `sglang/`, or a git
checkout of sglang-project/sglang holding `python/sglang/`. Patches are written for
the wheel layout; a checkout is patched with `git apply --directory=python`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version


class TargetError(ValueError):
    """The target directory is not an SGLang tree the patch tool understands."""


@dataclass(frozen=True)
class SglangTree:
    base: Path  # where `git apply` runs
    prefix: str  # "" for site-packages / wheel, "python" for a git checkout
    version: Version | None  # None: not readable (a git checkout without _version.py)

    @property
    def package(self) -> Path:
        return self.base / self.prefix / "sglang" if self.prefix else self.base / "sglang"

    @property
    def package_root(self) -> Path:
        """The folder holding `sglang/`: series' `detect` paths are relative to it."""
        return self.package.parent

    @property
    def layout(self) -> str:
        return "git checkout" if self.prefix else "site-packages"


_VERSION_RE = re.compile(r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", re.M)


def _read_version(package: Path) -> str | None:
    for name in ("_version.py", "version.py"):
        f = package / name
        if f.is_file() and (m := _VERSION_RE.search(f.read_text())):
            return m.group(1)
    for meta in sorted(package.parent.glob("sglang-*.dist-info/METADATA")):
        if m := re.search(r"^Version:\s*(\S+)", meta.read_text(), re.M):
            return m.group(1)
    pyproject = package.parent / "pyproject.toml"
    if pyproject.is_file() and (m := re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(), re.M)):
        return m.group(1)
    return None


def locate(target: str | Path, version: str | None = None) -> SglangTree:
    """The SGLang tree under `target`; `version` overrides the one read from the tree (None if unreadable)."""
    base = Path(target).resolve()
    if not base.is_dir():
        raise TargetError(f"{base} is not a directory: pass a site-packages dir, an unpacked wheel or a git checkout")
    if (base / "sglang" / "__init__.py").is_file():
        prefix = ""
    elif (base / "python" / "sglang" / "__init__.py").is_file():
        prefix = "python"
    elif base.name == "sglang" and (base / "__init__.py").is_file():
        base, prefix = base.parent, ""
    else:
        raise TargetError(
            f"no SGLang package under {base}: expected {base}/sglang/ (site-packages or unpacked wheel) "
            f"or {base}/python/sglang/ (git checkout)"
        )
    package = base / prefix / "sglang" if prefix else base / "sglang"
    text = version or _read_version(package)
    if text is None:  # a DDTree checkout: its series is found by what it contains
        return SglangTree(base, prefix, None)
    try:
        return SglangTree(base, prefix, Version(text))
    except InvalidVersion as exc:
        raise TargetError(f"{package}: version {text!r} is not a PEP 440 version: pass --sglang-version") from exc
