"""Run a deploy or rollback playbook so that however it stops, the host ends on a verified release.

    python -m ddtree_ops.play playbooks/deploy.yml -i inventory/production/hosts.yml --limit ct200 [ARGS...]

`make deploy` and `make rollback` go through this. ansible-playbook stops on Ctrl-C without running the
play's `always` (the lock stays) or its `rescue` (a switched `current` stays on a release that never
passed). So this runs the playbook with a token of its own in the environment (the lock's owner records
it), and when the run was interrupted (SIGINT, SIGTERM, SIGHUP) or lost a host (exit 4), runs
playbooks/resume.yml with the same arguments and token: under that lock it puts back a verified release
and releases the lock. Where even that cannot reach the host, the next deploy or rollback does it first.

The playbook lives and dies with this process: on Linux it gets SIGTERM when this process dies, however it
dies (kill -9 included), so no play goes on unseen behind a lock that names a dead run. The lock records the
playbook's own process beside this one (roles/ddtree/tasks/lock.yml).
"""

from __future__ import annotations

import ctypes
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

RESUME = "playbooks/resume.yml"
UNREACHABLE = 4  # ansible-playbook: a host could not be reached


def _ansible_playbook() -> str:
    beside = Path(sys.executable).parent / "ansible-playbook"
    return str(beside) if beside.exists() else "ansible-playbook"


PR_SET_PDEATHSIG = 1  # prctl(2)


def _die_with_parent(parent: int) -> None:
    """In the child before exec: SIGTERM when the parent dies (ansible-playbook stops its workers on SIGTERM)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # it died before the request took effect
        os._exit(1)


def _run(cmd: list[str], env: dict[str, str]) -> tuple[int, int | None]:
    """Run `cmd`; a SIGINT/SIGTERM/SIGHUP sent to this process is passed on as SIGINT (ansible stops cleanly on it).
    Returns the exit code and the first signal received, if any."""
    received: list[int] = []
    parent = os.getpid()
    proc = subprocess.Popen(cmd, env=env, preexec_fn=lambda: _die_with_parent(parent))

    def on_signal(signum: int, _frame) -> None:
        received.append(signum)
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)

    handlers = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        rc = proc.wait()
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    return rc, (received[0] if received else None)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or not args[0].endswith((".yml", ".yaml")):
        print("usage: python -m ddtree_ops.play PLAYBOOK.yml [ansible-playbook arguments]", file=sys.stderr)
        return 2
    playbook, rest = args[0], args[1:]
    env = {**os.environ, "DDTREE_RUN_TOKEN": secrets.token_hex(12), "DDTREE_RUN_PID": str(os.getpid())}
    rc, signum = _run([_ansible_playbook(), playbook, *rest], env)
    if "--check" in rest or "-C" in rest or not (signum or rc == UNREACHABLE or rc < 0):
        return rc
    why = (signal.Signals(signum).name if signum else f"ansible-playbook was killed by {signal.Signals(-rc).name}"
           if rc < 0 else "a host could not be reached")
    print(f"\n{playbook} stopped ({why}): running {RESUME} to put back a verified release and release the lock "
          "(Ctrl-C again to skip it; the next deploy or rollback then does it first)", file=sys.stderr, flush=True)
    resume_rc, again = _run([_ansible_playbook(), RESUME, *rest], env)
    if again or resume_rc != 0:
        print(f"{RESUME} did not finish (exit {resume_rc}): the host may still have `current` on an unverified "
              "release and a stale lock; the next `make deploy` or `make rollback` (with -e ddtree_break_lock=true) "
              "puts it right first", file=sys.stderr)
    return 130 if signum else (128 - rc if rc < 0 else rc)  # a playbook killed by signal N: the shell's 128 + N


if __name__ == "__main__":
    sys.exit(main())
