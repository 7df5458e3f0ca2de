"""The release job: apply the patch series to each SGLang release and report a compatibility matrix.

    ddtree-ops release-job                         # every release on PyPI from 0.5.14
    ddtree-ops release-job --versions 0.5.22,0.5.23 --out report/

Besides the releases, each DDTree git source of patches/ddtree-sources.toml gets a row (no
release has DDTree): its snapshot made into a git checkout, or with --fetch-git the commit
fetched from its URL.

For each release: download the wheel (no dependencies), unpack its sources, check each
patch on the pristine tree (applies, or the hunk and reason it fails), apply the series
with the same tool the playbooks use, and run the patched-source checks
(patched_checks.all_checks). A release that breaks is a row in the matrix, never a crash.
Writes matrix.json and matrix.md.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from packaging.version import Version

from . import patchtool
from .ddtree_sources import DDTreeSource, git_checkout, load_sources
from .patched_checks import all_checks
from .series import load_series, select_series
from .sglang_tree import locate
from .wheels import released_versions, sglang_wheel, unpack_sources


@dataclass
class ReleaseRow:
    version: str
    series: str = ""
    patches: dict[str, str] = field(default_factory=dict)  # name -> "applies" | "fails: hunk ...: reason"
    checks_passed: int = 0
    checks_total: int = 0
    failed_checks: list[str] = field(default_factory=list)
    error: str = ""
    known_unsupported: str = ""  # a DDTree source listed as unable to serve our kernel, and why

    @property
    def supported(self) -> bool:
        return (not self.error and bool(self.patches) and all(v == "applies" for v in self.patches.values())
                and self.checks_total > 0 and self.checks_passed == self.checks_total)


@dataclass
class Matrix:
    generated: str
    rows: list[ReleaseRow]

    def supported_all(self) -> bool:
        """Every row supported, except sources listed as known unsupported."""
        return all(r.supported or r.known_unsupported for r in self.rows)

    def to_markdown(self) -> str:
        names = sorted({p for r in self.rows for p in r.patches})
        short = " | ".join(n.split("-")[0] for n in names)
        head = f"| SGLang | series | {short} | patched-source checks | verdict |"
        lines = [f"SGLang release compatibility, generated {self.generated} by `ddtree-ops release-job`.", "",
                 "Patches: " + ", ".join(f"{n.split('-')[0]} = {n}" for n in names), "", head,
                 "|" + "---|" * (len(names) + 4)]
        for r in self.rows:
            cells = [r.patches.get(n, "—") for n in names]
            checks = f"{r.checks_passed}/{r.checks_total}" + (f" (failed: {'; '.join(r.failed_checks)})"
                                                              if r.failed_checks else "")
            verdict = "supported" if r.supported else ("error: " + r.error if r.error else "NOT supported")
            if r.known_unsupported and not r.supported:
                verdict += f" (known: {r.known_unsupported})"
            lines.append(f"| {r.version} | {r.series or '—'} | " + " | ".join(cells) + f" | {checks} | {verdict} |")
        return "\n".join(lines) + "\n"


def _quietly(fn, *args):
    """Run the patched-source checks without their expected log lines (our backend built with no pool warns that it
    reserves no workspace): a row's line says only its verdict."""
    quiet = logging.getLogger("ddtree_kernels")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        return fn(*args)
    finally:
        quiet.setLevel(level)


def check_release(version: str, patches=None, tree_dir: Path | None = None, label: str = "") -> ReleaseRow:
    """One release's row. `tree_dir` (unpacked sources or a checkout) skips the download; `version` ""
    leaves the version to the tree (a DDTree checkout has none) and `label` names the row."""
    row = ReleaseRow(label or version)
    work = None
    try:
        work = tree_dir or unpack_sources(sglang_wheel(version))
        tree = locate(work, version or None)
        all_series = load_series(patches)
        try:
            series = select_series(tree.version, all_series, package_root=tree.package_root)
        except LookupError:  # a release newer than any validated series: try the newest ranged series
            series = max((s for s in all_series if s.min_version is not None), key=lambda s: s.min_version)
        row.series = series.name
        for p in series.patches:
            failures = patchtool.explain_failure(tree, p)
            row.patches[p.name] = "applies" if not failures else "fails: " + "; ".join(
                f"{f.file} hunk {f.hunk}: {f.reason}" for f in failures)
        if all(v == "applies" for v in row.patches.values()):
            patchtool.apply(work, series=series.name, patches=patches, sglang_version=version or None)
            results = _quietly(all_checks, tree)
            row.checks_total = len(results)
            row.checks_passed = sum(r.ok for r in results)
            row.failed_checks = [f"{r.name}: {r.detail}" for r in results if not r.ok]
    except Exception as exc:  # download, unpack or tool failure: report it on the row
        row.error = f"{type(exc).__name__}: {exc}"
    finally:
        if work is not None and tree_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    return row


def _fetch(source: DDTreeSource, dest: Path) -> None:
    """Check out source.commit from source.url into dest (network; only with --fetch-git)."""
    for cmd in (["git", "init", "-q", str(dest)],
                ["git", "-C", str(dest), "fetch", "-q", "--depth", "1", source.url, source.commit],
                ["git", "-C", str(dest), "checkout", "-q", "FETCH_HEAD"]):
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"could not fetch {source.url}@{source.commit[:12]}: {proc.stderr.strip()[-300:]}")


def check_ddtree_source(source: DDTreeSource, patches=None, fetch_git: bool = False) -> ReleaseRow:
    """A DDTree source's row: its snapshot (or, with fetch_git, its commit) patched and checked."""
    label = f"{source.name} @ {source.commit[:8]}"
    with tempfile.TemporaryDirectory(prefix=f"ddtree-{source.name}-") as tmp:
        dest = Path(tmp) / "checkout"
        try:
            if (snapshot := source.snapshot_path()) is not None:
                git_checkout(snapshot, dest)
                label += " (snapshot)"
            elif fetch_git:
                _fetch(source, dest)
            else:
                return ReleaseRow(label, error="no snapshot here; run with --fetch-git where the git host is reachable",
                                  known_unsupported=source.known_unsupported)
        except Exception as exc:
            return ReleaseRow(label, error=f"{type(exc).__name__}: {exc}", known_unsupported=source.known_unsupported)
        row = check_release("", patches, tree_dir=dest, label=label)
        row.known_unsupported = source.known_unsupported
        return row


def _report(row: ReleaseRow) -> None:
    if row.supported:
        print("supported", flush=True)
        return
    why = row.error or "; ".join(row.failed_checks) or "; ".join(f"{k}: {v}" for k, v in row.patches.items()
                                                                    if v != "applies")
    known = f" (known: {row.known_unsupported})" if row.known_unsupported else ""
    print(f"NOT supported{known}: {why}", flush=True)


def run_release_job(versions: list[str] | None = None, out: str | Path = "release-report", patches=None,
                    oldest: str = "0.5.14", ddtree_sources: list[DDTreeSource] | None = None,
                    fetch_git: bool = False) -> Matrix:
    """Rows for `versions` (default: every release from `oldest`) and for `ddtree_sources`
    (default: patches/ddtree-sources.toml; [] for none)."""
    versions = versions or released_versions(oldest)
    versions = sorted(versions, key=Version)
    sources = load_sources() if ddtree_sources is None else ddtree_sources
    rows = []
    total = len(versions) + len(sources)
    for i, v in enumerate(versions, 1):
        print(f"[{i}/{total}] sglang {v} ...", end=" ", flush=True)
        row = check_release(v, patches)
        _report(row)
        rows.append(row)
    for i, source in enumerate(sources, len(versions) + 1):
        print(f"[{i}/{total}] DDTree {source.name} @ {source.commit[:12]} ...", end=" ", flush=True)
        row = check_ddtree_source(source, patches, fetch_git)
        _report(row)
        rows.append(row)
    matrix = Matrix(time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), rows)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "matrix.json").write_text(json.dumps(
        {"generated": matrix.generated, "rows": [asdict(r) | {"supported": r.supported} for r in rows]}, indent=1))
    (out / "matrix.md").write_text(matrix.to_markdown())
    print(f"wrote {out / 'matrix.json'} and {out / 'matrix.md'}")
    return matrix
