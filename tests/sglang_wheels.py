"""Real SGLang release wheels for tests: `pip download --no-deps`, cached in .cache/wheels."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CACHE = Path(__file__).resolve().parents[1] / ".cache" / "wheels"


def sglang_wheel(version: str) -> Path:
    """The wheel of SGLang `version`, downloading it (no dependencies) on first use."""
    found = sorted(CACHE.glob(f"sglang-{version}-*.whl"))
    if not found:
        CACHE.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
             f"sglang=={version}", "-d", str(CACHE)],
            capture_output=True, text=True,
        )
        found = sorted(CACHE.glob(f"sglang-{version}-*.whl"))
        if not found:
            raise RuntimeError(f"could not download sglang=={version}: {proc.stderr.strip()[-500:]}")
    return found[-1]
