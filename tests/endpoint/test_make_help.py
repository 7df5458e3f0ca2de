"""`make help` says what the targets the operator reads about here do (the test hosts' teardown among them)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_testhost_down_says_it_removes_every_test_host():
    """`make testhost-down` removes every `ddt<k>-host<i>` namespace (tests/support/testhost.py remove_leftovers),
    a running test's too: its help line must not promise it touches only its own."""
    out = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    line = next(x for x in out.splitlines() if x.split()[:1] == ["testhost-down"])
    assert "every test-host namespace" in line and "a running test's too" in line and "only" not in line
