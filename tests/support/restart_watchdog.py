"""systemd's Restart=on-failure for the test hosts, whose systemctl (docker-systemctl-replacement) does not
supervise: every second, each unit under /etc/systemd/system with Restart=on-failure or always that
`systemctl is-active` reports failed (its process died; a stopped unit is inactive) is started again after
its RestartSec. Runs inside a test host's namespaces (testhost.py starts it); production has systemd.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

UNITS = Path("/etc/systemd/system")


def restart_policy(unit: Path) -> tuple[str, float]:
    text = unit.read_text(errors="replace")
    policy = re.search(r"^Restart=(\S+)", text, re.M)
    delay = re.search(r"^RestartSec=([0-9.]+)", text, re.M)
    return (policy.group(1) if policy else "no"), (float(delay.group(1)) if delay else 0.1)


def is_failed(name: str) -> bool:
    state = subprocess.run(["systemctl", "is-active", name], capture_output=True, text=True).stdout.strip()
    return state == "failed"


def tick(failed_since: dict[str, float]) -> None:
    now = time.monotonic()
    for unit in sorted(UNITS.glob("*.service")):
        policy, delay = restart_policy(unit)
        if policy not in ("on-failure", "always") or not is_failed(unit.name):
            failed_since.pop(unit.name, None)
            continue
        since = failed_since.setdefault(unit.name, now)
        if now - since >= delay:
            print(f"restarting {unit.name} (Restart={policy}, RestartSec={delay:g})", flush=True)
            subprocess.run(["systemctl", "start", unit.name], check=False)
            failed_since.pop(unit.name, None)


def main() -> None:
    failed_since: dict[str, float] = {}
    while True:
        tick(failed_since)
        time.sleep(1.0)


if __name__ == "__main__":
    sys.exit(main())
