"""systemd's Restart=on-failure for the test hosts, whose systemctl (docker-systemctl-replacement) does not
supervise: every second, each unit under /etc/systemd/system with Restart=on-failure or always that the
replacement reports failed (its process died; a stopped unit is inactive) is started again after its
RestartSec. Runs inside a test host's namespaces (testhost.py starts it); production has systemd.
The state is read by the replacement's own code loaded once in this process (~10 ms of CPU a check):
`systemctl is-active` as a command costs ~0.5 s of CPU a call, which every second on each test host took
most of a 2-core CI machine.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import re
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

UNITS = Path("/etc/systemd/system")
SYSTEMCTL = "/usr/bin/systemctl"  # the replacement, bind-mounted there by testhost.py


def load_systemctl(path: str = SYSTEMCTL) -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("systemctl_replacement", path)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


def restart_policy(unit: Path) -> tuple[str, float]:
    text = unit.read_text(errors="replace")
    policy = re.search(r"^Restart=(\S+)", text, re.M)
    delay = re.search(r"^RestartSec=([0-9.]+)", text, re.M)
    return (policy.group(1) if policy else "no"), (float(delay.group(1)) if delay else 0.1)


def is_failed(systemctl: ModuleType, name: str) -> bool:
    """What `systemctl is-active NAME` prints, read in-process (a fresh Systemctl reads the unit and status anew)."""
    return systemctl.Systemctl().get_active_unit(name) == "failed"


def tick(systemctl: ModuleType, failed_since: dict[str, float]) -> None:
    now = time.monotonic()
    for unit in sorted(UNITS.glob("*.service")):
        policy, delay = restart_policy(unit)
        if policy not in ("on-failure", "always") or not is_failed(systemctl, unit.name):
            failed_since.pop(unit.name, None)
            continue
        since = failed_since.setdefault(unit.name, now)
        if now - since >= delay:
            print(f"restarting {unit.name} (Restart={policy}, RestartSec={delay:g})", flush=True)
            subprocess.run(["systemctl", "start", unit.name], check=False)
            failed_since.pop(unit.name, None)


def main() -> None:
    systemctl = load_systemctl()
    failed_since: dict[str, float] = {}
    while True:
        tick(systemctl, failed_since)
        time.sleep(1.0)


if __name__ == "__main__":
    sys.exit(main())
