"""What a release venv should hold, recorded when the deploy builds it and checked before anything trusts it.

The record (`<venv dir>/venv-record.json`, beside the venv) lists every installed distribution with its
version and the sha256 of each file of the distributions we patch or ship (sglang, ddtree-kernels,
ddtree-ops) as they were right after the patch set went in, with the patch set's own digests. A hand edit
to a patched SGLang file, a `pip install` into the venv or a deleted file shows up as a named difference.
Run with the venv's own interpreter: it reads the distributions of the environment it runs in.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import sys
import sysconfig
from pathlib import Path

WATCHED = ("sglang", "ddtree-kernels", "ddtree-ops")  # their files are hashed; other distributions by version
RECORD_NAME = "venv-record.json"


def default_record_path() -> Path:
    """Beside the running venv (resolved: releases reach their venv through a link)."""
    return Path(sys.prefix).resolve().parent / RECORD_NAME


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _distributions() -> dict[str, md.Distribution]:
    found: dict[str, md.Distribution] = {}
    for dist in md.distributions(path=[sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]):
        found.setdefault(_norm(dist.metadata["Name"]), dist)
    return found


def _watched_files(dists: dict[str, md.Distribution], extra: list[str]) -> dict[str, str]:
    """site-packages-relative path -> sha256, for the watched distributions' files and `extra` (files a patch adds)."""
    site = Path(sysconfig.get_paths()["purelib"])
    names: set[str] = set(extra)
    for name in WATCHED:
        for f in (dists[name].files or []) if name in dists else []:
            if "__pycache__" not in f.parts and not str(f).startswith(".."):  # scripts live outside site-packages
                names.add(str(f))
    return {name: _sha256(site / name) if (site / name).is_file() else "missing" for name in sorted(names)}


def make_record(patch_record: dict | None = None, patched_files: list[str] | None = None) -> dict:
    """The record of the environment this interpreter runs in."""
    dists = _distributions()
    return {"python": sys.version.split()[0],
            "distributions": {name: d.version for name, d in sorted(dists.items())},
            "patches": patch_record or {},
            "files": _watched_files(dists, patched_files or [])}


def differences(record: dict) -> list[str]:
    """Each way the environment differs from `record`, one line each naming the file or distribution."""
    now = make_record(patched_files=[f for f in record.get("files", {})])
    out = []
    for name in sorted(set(record["distributions"]) | set(now["distributions"])):
        was, has = record["distributions"].get(name), now["distributions"].get(name)
        if was != has:
            out.append(f"distribution {name}: {was or 'not installed'} recorded, {has or 'not installed'} now")
    for path, digest in record.get("files", {}).items():
        current = now["files"].get(path, "missing")
        if current != digest:
            out.append(f"{path}: {'missing' if current == 'missing' else 'changed'} since the venv was built")
    for path in sorted(set(now["files"]) - set(record.get("files", {}))):
        out.append(f"{path}: not in the record (added since the venv was built)")
    return out


def write(path: Path, patch_record: dict | None, patched_files: list[str]) -> dict:
    record = make_record(patch_record, patched_files)
    path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record


def check(path: Path) -> list[str]:
    """Differences from the record at `path`; a missing or unreadable record is one difference naming it."""
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return [f"{path}: no record (a venv built before records existed, or the record was removed)"]
    except ValueError as exc:
        return [f"{path}: unreadable record ({exc})"]
    return differences(record)
