"""Start a release's server from its launch file: the one argument vector the deploy checked.

    ddtree-ops serve /srv/ddtree/current/launch.json        (the systemd unit's ExecStart)

The deploy writes `launch.json` ({"module": "sglang.launch_server", "argv": [...]}) into each release;
`ddtree-ops launch-check --launch` parses exactly that vector before the switch, and this command
execs exactly it (no shell, so no word is split or dropped), adding `--api-key` from DDTREE_API_KEY
(the 0600 env file) and naming the release it belongs to in DDTREE_RELEASE_ID, so the deploy can read
from the process itself which release is serving (/proc/<pid>/environ).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


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


def serve(path: str | Path) -> None:
    module, argv = read_launch(path)
    key = os.environ.get("DDTREE_API_KEY", "")
    if key:
        argv += ["--api-key", key]
    os.environ["DDTREE_RELEASE_ID"] = release_of(path)
    os.execv(sys.executable, [sys.executable, "-m", module, *argv])
