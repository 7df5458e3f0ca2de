"""The patch series manifest (patches/series.toml): which patches, for which SGLang releases."""

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
    min_version: Version
    max_version: Version | None
    patches: tuple[Patch, ...]

    def covers(self, version: Version) -> bool:
        v = Version(version.base_version)  # 0.5.23.dev4+g93e9850 counts as 0.5.23
        return v >= self.min_version and (self.max_version is None or v <= self.max_version)


def patches_dir(explicit: str | Path | None = None) -> Path:
    """--patches, else $DDTREE_PATCHES, else the repository's patches/."""
    return Path(explicit or os.environ.get("DDTREE_PATCHES") or DEFAULT_PATCHES)


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
        out.append(Series(entry["name"], Version(entry["min_version"]),
                          Version(entry["max_version"]) if entry.get("max_version") else None, patches))
    return out


def select_series(version: Version, series: list[Series], name: str | None = None) -> Series:
    """The series for `version`, or the one called `name` (to try a series on a newer release)."""
    if name is not None:
        for s in series:
            if s.name == name:
                return s
        raise LookupError(f"no series named {name!r}; have: {', '.join(s.name for s in series)}")
    for s in series:
        if s.covers(version):
            return s
    ranges = "; ".join(f"{s.name}: {s.min_version}..{s.max_version or 'newer'}" for s in series)
    raise LookupError(
        f"SGLang {version} is outside every patch series ({ranges}). Pin a supported release, or try a "
        f"series with --series NAME (the release job reports which apply)."
    )
