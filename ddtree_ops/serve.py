"""Start a release's server from its launch file: the one argument vector the deploy checked.

    ddtree-ops serve /srv/ddtree/current/launch.json        (the systemd unit's ExecStart)

The deploy writes `launch.json` ({"module": "sglang.launch_server", "argv": [...]}) into each release;
`ddtree-ops launch-check --launch` parses exactly that vector before the switch, and this command
execs exactly it (no shell, so no word is split or dropped), adding `--api-key` from DDTREE_API_KEY
(the 0600 env file) and naming the release it belongs to in DDTREE_RELEASE_ID, so the deploy can read
from the process itself which release is serving (/proc/<pid>/environ).

It starts only a verified release (its `.verified` marker: health and smoke passed), or the one a deploy or
rollback is verifying right now: that run writes a short lease (`.deploy-lock/verifying.json`, see
roles/ddtree/tasks/lease.yml) just before it restarts the unit. So however a run is killed after it switched
`current`, systemd's `Restart=` never brings up a release that never passed: it is refused, naming the
verified release to roll back to.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

LEASE = Path(".deploy-lock") / "verifying.json"  # under the install root; written by roles/ddtree/tasks/lease.yml


class LaunchError(RuntimeError):
    """The launch file is missing or malformed; the message names it and the fix."""


def read_launch(path: str | Path) -> tuple[str, list[str]]:
    """(module, argv) of a launch file; refuses a missing file, a missing module and empty words."""
    path = Path(path)
    try:
        spec = json.loads(path.read_text())
    except FileNotFoundError:
        raise LaunchError(f"{path} does not exist: deploy the release again (it writes launch.json)") from None
    except ValueError as exc:
        raise LaunchError(f"{path} is not JSON ({exc}): deploy the release again") from None
    module, argv = spec.get("module"), spec.get("argv")
    if not isinstance(module, str) or not module or not isinstance(argv, list):
        raise LaunchError(f"{path} needs a 'module' (e.g. sglang.launch_server) and an 'argv' list")
    empty = [argv[i - 1] if i else "(first word)" for i, word in enumerate(argv) if not str(word)]
    if empty:
        raise LaunchError(f"{path}: empty value after {', '.join(map(str, empty))}")
    return module, [str(w) for w in argv]


def release_of(path: str | Path) -> str:
    """The release a launch file belongs to: its folder's name, `current` resolved."""
    return Path(path).resolve().parent.name


class UnverifiedRelease(LaunchError):
    """The release never passed its deploy's checks and no run is verifying it."""


def verified_releases(root: Path) -> list[str]:
    """The install root's verified releases, oldest first (by the install sequence their manifests record)."""
    found = []
    for marker in (root / "releases").glob("*/.verified"):
        try:
            sequence = int(json.loads((marker.parent / "manifest.json").read_text()).get("sequence", 0))
        except (OSError, ValueError, TypeError, AttributeError):
            sequence = 0
        found.append((sequence, marker.stat().st_mtime, marker.parent.name))
    return [name for *_, name in sorted(found)]


def lease_holder(root: Path, now: float | None = None) -> str | None:
    """The release a running deploy or rollback may start (a lease younger than its `valid_s`), if any."""
    path = root / LEASE
    try:
        lease = json.loads(path.read_text())
        age = (time.time() if now is None else now) - path.stat().st_mtime
        return str(lease["release"]) if 0 <= age < float(lease["valid_s"]) else None
    except (OSError, ValueError, TypeError, KeyError):
        return None


def check_may_start(path: str | Path) -> None:
    """Refuse a release that is neither verified nor leased to the run verifying it (UnverifiedRelease)."""
    release_dir = Path(path).resolve().parent
    release, root = release_dir.name, release_dir.parent.parent
    if not release_dir.is_dir():
        raise LaunchError(f"{path} points into {release_dir}, which does not exist (the release folder was removed): "
                          "roll back to a verified release (make rollback HOST=<host>) or deploy again")
    if (release_dir / ".verified").exists() or lease_holder(root) == release:
        return
    others = [r for r in verified_releases(root) if r != release]
    back = (f"roll back to verified release {others[-1]}: ansible-playbook playbooks/rollback.yml --limit <host> "
            f"(or `make rollback HOST=<host>`), which puts it in {root}/current and restarts"
            if others else "no verified release is on this host: deploy one (make deploy HOST=<host>)")
    raise UnverifiedRelease(
        f"not starting release {release}: it never passed its deploy's health check and smoke test (no "
        f"{release_dir}/.verified) and no deploy or rollback is verifying it now (no live lease in {root / LEASE}); "
        f"a run was stopped after it switched {root}/current. To fix: {back}")


def serve(path: str | Path) -> None:
    check_may_start(path)
    module, argv = read_launch(path)
    key = os.environ.get("DDTREE_API_KEY", "")
    if key:
        argv += ["--api-key", key]
    os.environ["DDTREE_RELEASE_ID"] = release_of(path)
    os.execv(sys.executable, [sys.executable, "-m", module, *argv])
