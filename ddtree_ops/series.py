"""The patch series manifest (patches/series.toml): which patches, for which SGLang sources.

A series is chosen for a tree in this order: the one named explicitly (--series, or the
inventory's ddtree_patch_series); else the first series whose `detect` file exists in the
tree (a DDTree branch, whatever version its git build reports); else the series whose
release range holds the tree's version.
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEFAULT_PATCHES = Path(__file__).resolve().parents[1] / "patches"


@dataclass(frozen=True)
class Patch:
    name: str
    path: Path

    def sha256(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class Series:
    name: str
    min_version: Version | None
    max_version: Version | None
    patches: tuple[Patch, ...]
    detect: str = ""  # a path under the package root (sglang/...) that marks the sources this series is for

    def covers(self, version: Version | None) -> bool:
        """Does the release range hold `version`? A detect-only series has no range."""
        if version is None or self.min_version is None:
            return False
        v = Version(version.base_version)  # 0.5.23.dev4+g93e9850 counts as 0.5.23
        return v >= self.min_version and (self.max_version is None or v <= self.max_version)

    def detects(self, package_root: Path) -> bool:
        """Is this the series for the tree whose `sglang/` lives under `package_root`?"""
        return bool(self.detect) and (package_root / self.detect).is_file()

    @property
    def scope(self) -> str:
        if self.detect:
            return f"sources with {self.detect}"
        return f"{self.min_version}..{self.max_version or 'newer'}"


def patches_dir(explicit: str | Path | None = None) -> Path:
    """--patches, else $DDTREE_PATCHES, else the repository's patches/ (absolute: `patch` runs in the tree)."""
    return Path(explicit or os.environ.get("DDTREE_PATCHES") or DEFAULT_PATCHES).resolve()


def load_series(directory: str | Path | None = None) -> list[Series]:
    root = patches_dir(directory)
    manifest = root / "series.toml"
    if not manifest.is_file():
        raise FileNotFoundError(f"no patch manifest at {manifest}: pass --patches DIR (the repo's patches/)")
    out = []
    for entry in tomllib.loads(manifest.read_text())["series"]:
        folder = root / entry["directory"]
        patches = tuple(Patch(name, folder / name) for name in entry["patches"])
        missing = [p.name for p in patches if not p.path.is_file()]
        if missing:
            raise FileNotFoundError(f"series {entry['name']}: {', '.join(missing)} not in {folder}")
        if not entry.get("detect") and not entry.get("min_version"):
            raise ValueError(f"series {entry['name']} in {manifest}: set min_version (a release range) or detect")
        out.append(Series(entry["name"], Version(entry["min_version"]) if entry.get("min_version") else None,
                          Version(entry["max_version"]) if entry.get("max_version") else None, patches,
                          entry.get("detect", "")))
    return out


def select_series(version: Version | None, series: list[Series], name: str | None = None,
                  package_root: Path | None = None) -> Series:
    """The series named `name`; else the one that detects the tree under `package_root`; else by `version`."""
    if name:
        for s in series:
            if s.name == name:
                return s
        raise LookupError(f"no series named {name!r}; have: {', '.join(s.name for s in series)}")
    if package_root is not None:
        for s in series:
            if s.detects(package_root):
                return s
    for s in series:
        if s.covers(version):
            return s
    scopes = "; ".join(f"{s.name}: {s.scope}" for s in series)
    what = f"SGLang {version}" if version is not None else "an SGLang tree of unknown version"
    raise LookupError(
        f"{what} matches no patch series ({scopes}). Pin a supported release or DDTree commit, or try a "
        f"series with --series NAME (the release job reports which apply)."
    )
