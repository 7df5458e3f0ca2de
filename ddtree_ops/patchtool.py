"""Check, apply, revert and report the SGLang patch series on a target tree, with `git apply`.

All or nothing comes from git itself: `git apply` with several patches changes nothing
unless every hunk of every patch applies. Applying twice is a no-op that says so;
what was applied (series, patch names, SHA-256) is recorded in the target's sglang/
package as .ddtree-patches.json. A failure names the patch, the file, the hunk and
git's reason.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .series import Patch, Series, load_series, select_series
from .sglang_tree import SglangTree, locate

RECORD = ".ddtree-patches.json"
APPLIED, NOT_APPLIED, CONFLICT = "applied", "not applied", "does not apply"
MODIFIED = "modified since applied"  # recorded as applied, but its files no longer hold it
CLEAN_STATES = {APPLIED, NOT_APPLIED}


@dataclass
class HunkFailure:
    patch: str
    file: str
    hunk: str  # e.g. "#1 @@ -196,7 +196,11 @@ def resolve_dflash_verify_mask_policy(...)"
    reason: str

    def __str__(self) -> str:
        return f"{self.patch}: {self.file}: hunk {self.hunk}: {self.reason}"


class PatchError(RuntimeError):
    """The series cannot be applied or reverted; the target was left as it was."""

    def __init__(self, message: str, failures: list[HunkFailure] | None = None):
        self.failures = failures or []
        details = "".join(f"\n  - {f}" for f in self.failures)
        super().__init__(message + details)


@dataclass
class Report:
    action: str
    target: str
    layout: str
    sglang_version: str
    series: str
    outcome: str  # applied | already applied | reverted | not applied | would apply | ...
    patches: dict[str, str] = field(default_factory=dict)  # name -> state
    record: dict | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)


def _git_apply(tree: SglangTree, patches: list[Patch] | tuple[Patch, ...], *, reverse: bool = False,
               check: bool = False) -> subprocess.CompletedProcess:
    cmd = ["git", "apply", "--verbose"]
    cmd += ["--check"] if check else []
    cmd += ["--reverse"] if reverse else []
    cmd += [f"--directory={tree.prefix}"] if tree.prefix else []
    cmd += [str(p.path) for p in (reversed(patches) if reverse else patches)]
    # Stop git from treating an enclosing repository as the root of a site-packages target.
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(tree.base.parent))
    return subprocess.run(cmd, cwd=tree.base, capture_output=True, text=True, env=env)


def patch_states(tree: SglangTree, series: Series) -> dict[str, str]:
    """Each patch on its own: applies forward (not applied), backward (applied), or neither: then
    modified since applied (the record says this patch went in) or does not apply (it never did)."""
    recorded = {r["name"] for r in (read_record(tree) or {}).get("patches", [])}
    states = {}
    for p in series.patches:
        if _git_apply(tree, [p], check=True).returncode == 0:
            states[p.name] = NOT_APPLIED
        elif _git_apply(tree, [p], check=True, reverse=True).returncode == 0:
            states[p.name] = APPLIED
        else:
            states[p.name] = MODIFIED if p.name in recorded else CONFLICT
    return states


def patch_files(patch: Patch) -> list[str]:
    """The files a patch changes (wheel layout: sglang/...)."""
    return list(_hunks(patch.path))


def _where(tree: SglangTree, series: Series, states: dict[str, str], wanted: set[str]) -> str:
    """'0002 (sglang/srt/...py)' for each patch in one of the `wanted` states, files as in the target."""
    prefix = f"{tree.prefix}/" if tree.prefix else ""
    return "; ".join(f"{p.name.split('-')[0]} ({', '.join(prefix + f for f in patch_files(p))})"
                     for p in series.patches if states[p.name] in wanted)


def _hunks(patch: Path) -> dict[str, list[tuple[int, str]]]:
    """file -> [(old start line, hunk header)] in order."""
    out: dict[str, list[tuple[int, str]]] = {}
    current = None
    for line in patch.read_text().splitlines():
        if line.startswith("+++ b/"):
            current = line[6:]
            out.setdefault(current, [])
        elif line.startswith("@@ ") and current is not None:
            m = re.match(r"@@ -(\d+)", line)
            out[current].append((int(m.group(1)) if m else 0, line))
    return out


def explain_failure(tree: SglangTree, patch: Patch) -> list[HunkFailure]:
    """Which hunks of `patch` do not apply to `tree`, and git's reason for each."""
    proc = _git_apply(tree, [patch], check=True)
    if proc.returncode == 0:
        return []
    hunks = _hunks(patch.path)
    failures = []
    lines = proc.stderr.splitlines()
    for i, line in enumerate(lines):
        if m := re.match(r"error: patch failed: (.+):(\d+)$", line):
            path, start = m.group(1), int(m.group(2))
            rel = path[len(tree.prefix) + 1:] if tree.prefix and path.startswith(tree.prefix + "/") else path
            index, header = next(
                ((k, h) for k, (s, h) in enumerate(hunks.get(rel, []), 1) if s == start), (0, f"at line {start}")
            )
            searched = [x for x in lines[max(0, i - 12):i] if x and not x.startswith(("Checking", "error:"))]
            reason = "its context lines are not in the file"
            if searched:
                reason += f" (searched for: {searched[-1].strip()!r})"
            failures.append(HunkFailure(patch.name, rel, f"#{index} {header}" if index else header, reason))
        elif (m := re.match(r"error: (.+?): (No such file or directory|does not exist in index)$", line)):
            failures.append(HunkFailure(patch.name, m.group(1), "(all)", "the file is missing"))
        elif (m := re.match(r"error: (.+?): already exists", line)):
            failures.append(HunkFailure(patch.name, m.group(1), "(all)", "the file already exists"))
    if not failures:
        last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "git apply failed"
        failures.append(HunkFailure(patch.name, "?", "?", last))
    return failures


def _record_path(tree: SglangTree) -> Path:
    return tree.package / RECORD


def read_record(tree: SglangTree) -> dict | None:
    path = _record_path(tree)
    return json.loads(path.read_text()) if path.is_file() else None


def _write_record(tree: SglangTree, series: Series) -> dict:
    record = {
        "tool": "ddtree-ops",
        "series": series.name,
        "sglang_version": str(tree.version) if tree.version is not None else "unknown",
        "layout": tree.layout,
        "patches": [{"name": p.name, "sha256": p.sha256()} for p in series.patches],
        "applied_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    _record_path(tree).write_text(json.dumps(record, indent=1) + "\n")
    return record


def _resolve(target, series_name, patches, sglang_version) -> tuple[SglangTree, Series]:
    tree = locate(target, sglang_version)
    record = read_record(tree)
    name = series_name or (record or {}).get("series")
    try:
        return tree, select_series(tree.version, load_series(patches), name, tree.package_root)
    except LookupError as exc:
        if tree.version is None:
            raise LookupError(f"{exc} ({tree.package} has no readable version: pass --sglang-version X.Y.Z "
                              f"for a release checkout)") from None
        raise


def _report(action: str, tree: SglangTree, series: Series, outcome: str, states: dict) -> Report:
    version = str(tree.version) if tree.version is not None else "unknown"
    return Report(action, str(tree.base), tree.layout, version, series.name, outcome, states, read_record(tree))


def status(target, *, series: str | None = None, patches=None, sglang_version: str | None = None) -> Report:
    tree, s = _resolve(target, series, patches, sglang_version)
    states = patch_states(tree, s)
    values = set(states.values())
    if MODIFIED in values:
        outcome = MODIFIED
    elif CONFLICT in values:
        outcome = CONFLICT
    else:
        outcome = values.pop() if len(values) == 1 else "partially applied"
    return _report("status", tree, s, outcome, states)


def _refuse_changed(tree: SglangTree, s: Series, states: dict[str, str]) -> None:
    """Files changed by hand since the patches went in: say which, and how to get them back."""
    if MODIFIED in states.values():
        version = tree.version or "the same commit"
        raise PatchError(f"{tree.package}: {_where(tree, s, states, {MODIFIED})} changed since the patches were "
                         f"applied ({_fmt(states)}). Restore those files from SGLang {version} (in a release venv: "
                         f"pip install --force-reinstall --no-deps sglang=={version}; in a checkout: git checkout -- "
                         f"the files), then apply again")


def check(target, *, series: str | None = None, patches=None, sglang_version: str | None = None) -> Report:
    """Dry run: would `apply` succeed? Raises PatchError (naming the hunks) if not."""
    tree, s = _resolve(target, series, patches, sglang_version)
    states = patch_states(tree, s)
    if all(v == APPLIED for v in states.values()):
        return _report("check", tree, s, "already applied", states)
    _refuse_changed(tree, s, states)
    if any(v == APPLIED for v in states.values()):
        raise PatchError(f"{tree.package} is partially patched ({_fmt(states)}; applied: "
                         f"{_where(tree, s, states, {APPLIED})}): `ddtree-ops patch revert {tree.base}` takes the "
                         f"applied ones back out, then apply again")
    if _git_apply(tree, s.patches, check=True).returncode != 0:
        failures = [f for p in s.patches for f in explain_failure(tree, p)]
        raise PatchError(f"series {s.name} does not apply to SGLang {tree.version or '(unknown version)'} at "
                         f"{tree.package}: the patches' anchors moved; refresh them (patches/README.md)", failures)
    return _report("check", tree, s, "would apply", states)


def apply(target, *, series: str | None = None, patches=None, sglang_version: str | None = None) -> Report:
    """Apply the whole series, or nothing. A second run changes nothing and says so."""
    report = check(target, series=series, patches=patches, sglang_version=sglang_version)
    tree, s = _resolve(target, report.series, patches, sglang_version)
    if report.outcome == "already applied":
        if read_record(tree) is None:
            _write_record(tree, s)
        return _report("apply", tree, s, "already applied", report.patches)
    proc = _git_apply(tree, s.patches)
    if proc.returncode != 0:  # git applies all or nothing, so the tree is unchanged
        raise PatchError(f"git apply failed on {tree.package}; nothing was changed:\n{proc.stderr.strip()}")
    _write_record(tree, s)
    return _report("apply", tree, s, "applied", patch_states(tree, s))


def revert(target, *, series: str | None = None, patches=None, sglang_version: str | None = None) -> Report:
    """Take the whole series back out, leaving every file as it was before `apply`."""
    tree, s = _resolve(target, series, patches, sglang_version)
    states = patch_states(tree, s)
    if all(v == NOT_APPLIED for v in states.values()):
        _record_path(tree).unlink(missing_ok=True)
        return _report("revert", tree, s, "not applied", states)
    _refuse_changed(tree, s, states)
    if CONFLICT in states.values():
        raise PatchError(f"{tree.package}: {_where(tree, s, states, {CONFLICT})} neither applied nor revertible "
                         f"({_fmt(states)}): the files differ from what the series expects; reinstall SGLang there")
    applied = [p for p in s.patches if states[p.name] == APPLIED]  # a partial tree: take back what went in
    proc = _git_apply(tree, applied, reverse=True)
    if proc.returncode != 0:
        raise PatchError(f"git apply --reverse failed on {tree.package}; nothing was changed:\n{proc.stderr.strip()}")
    _record_path(tree).unlink(missing_ok=True)
    return _report("revert", tree, s, "reverted", patch_states(tree, s))


def _fmt(states: dict[str, str]) -> str:
    return ", ".join(f"{name.split('-')[0]} {state}" for name, state in states.items())
