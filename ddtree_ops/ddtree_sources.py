"""DDTree SGLang sources: the git branches that carry DDTree, as listed in patches/ddtree-sources.toml.

No SGLang release has DDTree; hosts run a wheel built from a pinned commit of a DDTree branch.
Each source names its repository URL and full commit, and optionally a `git archive` snapshot
(../shared/sglang-src/) that stands for it where no git host can be reached. `git_checkout`
turns a snapshot into a one-commit git repository (fixed author and dates, so the same snapshot
gives the same commit everywhere): the release job patches it, and the deploy tests install
from it through a file:// URL, exactly as production installs from the branch's URL.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .series import DEFAULT_PATCHES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SOURCES_FILE = DEFAULT_PATCHES / "ddtree-sources.toml"
# The team's snapshots sit beside the checkout (../shared/sglang-src); DDTREE_SGLANG_SNAPSHOTS overrides.
SNAPSHOTS = Path(os.environ.get("DDTREE_SGLANG_SNAPSHOTS") or DEFAULT_PATCHES.parents[1] / "shared" / "sglang-src")
_FIXED_IDENTITY = {"GIT_AUTHOR_NAME": "ddtree-snapshot", "GIT_AUTHOR_EMAIL": "ddtree-snapshot@localhost",
                   "GIT_COMMITTER_NAME": "ddtree-snapshot", "GIT_COMMITTER_EMAIL": "ddtree-snapshot@localhost",
                   "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}


@dataclass(frozen=True)
class DDTreeSource:
    name: str
    url: str
    commit: str
    snapshot: str = ""  # file name in SNAPSHOTS, or empty (fetch from url)
    notes: str = ""
    known_unsupported: str = ""  # why this source cannot serve our kernel; its row then does not fail --strict

    def snapshot_path(self, snapshots: Path = SNAPSHOTS) -> Path | None:
        path = snapshots / self.snapshot if self.snapshot else None
        return path if path is not None and path.is_file() else None


def load_sources(path: str | Path | None = None) -> list[DDTreeSource]:
    data = tomllib.loads(Path(path or SOURCES_FILE).read_text())
    return [DDTreeSource(**entry) for entry in data.get("source", [])]


def run_git(cwd: Path, *args: str) -> str:
    env = {**os.environ, **_FIXED_IDENTITY, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    proc = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"git {' '.join(args)} in {cwd} failed: {proc.stderr.strip()[-400:]}")
    return proc.stdout.strip()


def git_checkout(snapshot: Path, dest: Path) -> str:
    """Unpack `snapshot` (a git archive tarball) into `dest` as a one-commit repository; return the commit.

    Reuses `dest` when it already holds a repository; builds in a sibling folder and renames, so an
    interrupted run never leaves a half-made repository behind."""
    dest = Path(dest)
    if (dest / ".git").is_dir():
        return run_git(dest, "rev-parse", "HEAD")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{dest.name}-") as tmp:
        work = Path(tmp) / "repo"
        work.mkdir()
        with tarfile.open(snapshot) as tf:
            tops = {m.name.split("/", 1)[0] for m in tf.getmembers()}
            if hasattr(tarfile, "tar_filter"):  # 3.10.12+: refuse links and paths out of `work`
                tf.extractall(work, filter="tar")
            else:  # pragma: no cover
                tf.extractall(work)
        root = work / next(iter(tops)) if len(tops) == 1 and (work / next(iter(tops))).is_dir() else work
        run_git(root, "init", "-q", "-b", "main")
        run_git(root, "add", "-A")
        run_git(root, "commit", "-q", "-m", f"snapshot {snapshot.name}")
        os.replace(root, dest)
    return run_git(dest, "rev-parse", "HEAD")
