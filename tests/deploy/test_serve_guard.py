"""`ddtree-ops serve` (the unit's ExecStart) starts only a verified release or the one a live run has leased.

Plain files in a temporary install root laid out as the role lays it (releases/<id>/{launch.json, manifest.json,
.verified}, current -> releases/<id>, .deploy-lock/verifying.json); the deploy tests show the same refusal on a
test host after a killed deploy.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from ddtree_ops import cli
from ddtree_ops.serve import LEASE, LaunchError, UnverifiedRelease, check_may_start, lease_holder


def _release(root: Path, rid: str, sequence: int, verified: bool) -> Path:
    d = root / "releases" / rid
    d.mkdir(parents=True)
    (d / "launch.json").write_text(json.dumps({"module": "json.tool", "argv": ["--help"]}))
    (d / "manifest.json").write_text(json.dumps({"sequence": sequence}))
    if verified:
        (d / ".verified").write_text("smoke passed\n")
    return d


def _current(root: Path, rid: str) -> Path:
    link = root / "current"
    if link.is_symlink():
        link.unlink()
    link.symlink_to(f"releases/{rid}")
    return link / "launch.json"


def _lease(root: Path, rid: str, valid_s: int = 120, age_s: float = 0) -> None:
    path = root / LEASE
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"release": rid, "valid_s": valid_s, "token": "t"}))
    then = time.time() - age_s
    os.utime(path, (then, then))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    _release(tmp_path, "r-old", 1, verified=True)
    _release(tmp_path, "r-mid", 2, verified=True)
    _release(tmp_path, "r-new", 3, verified=False)
    return tmp_path


def test_a_verified_release_starts(root: Path):
    check_may_start(_current(root, "r-mid"))


def test_an_unverified_release_is_refused_naming_the_verified_one(root: Path):
    with pytest.raises(UnverifiedRelease) as err:
        check_may_start(_current(root, "r-new"))
    msg = str(err.value)
    assert "not starting release r-new" in msg and "never passed" in msg
    assert "roll back to verified release r-mid" in msg and "playbooks/rollback.yml" in msg  # newest by sequence


def test_a_live_lease_lets_exactly_its_release_start(root: Path):
    launch = _current(root, "r-new")
    _lease(root, "r-new")
    check_may_start(launch)
    _lease(root, "r-other")
    with pytest.raises(UnverifiedRelease):
        check_may_start(launch)


def test_an_expired_or_broken_lease_lets_nothing_start(root: Path):
    launch = _current(root, "r-new")
    _lease(root, "r-new", valid_s=120, age_s=121)  # the run that wrote it was killed two minutes ago
    assert lease_holder(root) is None
    with pytest.raises(UnverifiedRelease):
        check_may_start(launch)
    (root / LEASE).write_text("{not json")
    with pytest.raises(UnverifiedRelease):
        check_may_start(launch)


def test_no_verified_release_says_deploy_one(tmp_path: Path):
    _release(tmp_path, "r-only", 1, verified=False)
    with pytest.raises(UnverifiedRelease, match="no verified release is on this host: deploy one"):
        check_may_start(_current(tmp_path, "r-only"))


def test_a_removed_release_folder_is_named(root: Path):
    launch = _current(root, "r-gone")
    with pytest.raises(LaunchError, match="does not exist \\(the release folder was removed\\)"):
        check_may_start(launch)


def test_the_cli_refuses_with_the_reason_and_a_failing_status(root: Path, capsys):
    rc = cli.main(["serve", str(_current(root, "r-new"))])
    assert rc != 0 and "ddtree-ops serve: not starting release r-new" in capsys.readouterr().err
