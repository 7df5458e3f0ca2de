"""ddtree-ops venv-record on this machine's own venv: a fresh record matches, and each kind of change is named."""

from __future__ import annotations

import json
import subprocess
import sys

from ddtree_ops import venv_record


def _check(record) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddtree_ops", "venv-record", "check", "--record", str(record)],
                          capture_output=True, text=True, timeout=120)


def test_a_fresh_record_matches_and_changes_are_named(tmp_path):
    path = tmp_path / "venv-record.json"
    made = subprocess.run([sys.executable, "-m", "ddtree_ops", "venv-record", "write", "--record", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    record = json.loads(path.read_text())
    assert record["distributions"]["ddtree-ops"] and record["files"]  # ddtree-ops is a watched distribution
    assert _check(path).returncode == 0

    some_file = next(iter(record["files"]))
    record["files"][some_file] = "0" * 64  # as if the file had been edited after the record
    record["files"]["sglang/srt/gone.py"] = "0" * 64  # a file the build had and that is gone now
    record["distributions"]["ddtree-ops"] = "0.0.1"  # another version installed over it
    record["distributions"]["a-removed-package"] = "1.0"
    path.write_text(json.dumps(record))
    found = _check(path)
    assert found.returncode == 1 and "ddtree_venv_rebuild=true" in found.stderr
    lines = found.stdout.splitlines()
    assert f"MODIFIED: {some_file}: changed since the venv was built" in lines
    assert "MODIFIED: sglang/srt/gone.py: missing since the venv was built" in lines
    assert any(line.startswith("MODIFIED: distribution ddtree-ops: 0.0.1 recorded, ") for line in lines)
    assert "MODIFIED: distribution a-removed-package: 1.0 recorded, not installed now" in lines


def test_no_record_is_a_difference(tmp_path):
    assert venv_record.check(tmp_path / "none.json") == [
        f"{tmp_path / 'none.json'}: no record (a venv built before records existed, or the record was removed)"]
