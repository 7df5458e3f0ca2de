"""SGLang release wheels from the package index: which releases exist, download, unpack."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import requests
from packaging.version import Version

CACHE = Path(__file__).resolve().parents[1] / ".cache" / "wheels"
PYPI_JSON = "https://pypi.org/pypi/sglang/json"


def released_versions(oldest: str = "0.5.14", timeout: float = 30.0) -> list[str]:
    """Every non-yanked SGLang release on PyPI at or after `oldest`, oldest first (PyPI JSON API)."""
    try:
        resp = requests.get(PYPI_JSON, timeout=timeout)
        resp.raise_for_status()
    except requests.RequestException as exc:
        raise RuntimeError(f"could not list SGLang releases from {PYPI_JSON}: {exc}") from exc
    out = []
    for text, files in resp.json()["releases"].items():
        v = Version(text)
        if v.is_prerelease or v < Version(oldest) or not files or all(f.get("yanked") for f in files):
            continue
        out.append(v)
    return [str(v) for v in sorted(out)]


def sglang_wheel(version: str, cache: Path = CACHE) -> Path:
    """The wheel of SGLang `version` (`pip download --no-deps`, cached in .cache/wheels)."""
    found = sorted(cache.glob(f"sglang-{version}-*.whl"))
    if found:
        return found[-1]
    cache.mkdir(parents=True, exist_ok=True)
    # Download privately, then publish with an atomic rename: a concurrent reader (another test
    # worker, another job) never sees a half-written wheel.
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as private:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
             f"sglang=={version}", "-d", private],
            capture_output=True, text=True,
        )
        fetched = sorted(Path(private).glob(f"sglang-{version}-*.whl"))
        if not fetched:
            raise RuntimeError(f"could not download sglang=={version}: {proc.stderr.strip()[-400:]}")
        os.replace(fetched[-1], cache / fetched[-1].name)
    return cache / fetched[-1].name


def unpack_sources(wheel: Path, dest: Path | None = None) -> Path:
    """The wheel's Python sources (sglang/**/*.py) in a fresh folder: a target for the patch tool."""
    dest = Path(dest or tempfile.mkdtemp(prefix=f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}-"))
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(dest, [n for n in zf.namelist() if n.startswith("sglang/") and n.endswith(".py")])
    return dest
