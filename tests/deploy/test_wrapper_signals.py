"""`make deploy` / `make rollback` and the wrapper they run (ddtree_ops/play.py) under signals, without a host.

- make returns only after the wrapper has finished its resume, whatever signal the process group gets: the real
  Makefile recipe runs with PY pointing at a stand-in wrapper (below) that, like play.py, takes the signal and
  runs on for a moment (its "resume") before it exits 130.
- the playbook dies with the wrapper, kill -9 included: play.py's own _run starts a child and the wrapper is
  killed; the child must go too (the deploy tests show the same with the real ansible-playbook).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

STAND_IN_WRAPPER = textwrap.dedent("""\
    #!{python}
    # Stand-in for `python` in the Makefile's recipes: the guard passes; the wrapper waits for a signal, then
    # "resumes" (writes a file a moment later) and exits 130 as ddtree_ops.play does.
    import signal, sys, time
    if "ddtree_ops.hosts" in sys.argv:
        sys.exit(0)
    got = []
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, lambda n, f: got.append(n))
    print("wrapper up", flush=True)
    while not got:
        time.sleep(0.05)
    time.sleep(1.0)
    open({done!r}, "w").write("resumed after " + signal.Signals(got[0]).name)
    sys.exit(130)
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "\nState:\tZ" in status.read_text())


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
@pytest.mark.parametrize("target", ["deploy", "rollback"])
def test_make_returns_only_after_the_resume(target, sig, tmp_path):
    done = tmp_path / "resumed"
    fake = tmp_path / "python"
    fake.write_text(STAND_IN_WRAPPER.format(python=sys.executable, done=str(done)))
    fake.chmod(0o755)
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all: {}\n")
    make = subprocess.Popen(["make", "--no-print-directory", target, "HOST=gpu-x", f"INVENTORY={inventory}",
                             f"PY={fake}"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    seen = []
    for line in make.stdout:
        seen.append(line)
        if "wrapper up" in line:
            break
    assert "wrapper up" in "".join(seen), "".join(seen)
    os.killpg(make.pid, sig)  # as a terminal, a CI runner or systemd signals the whole group
    make.wait(timeout=120)  # make's exit, not its output's end (the wrapper holds the pipe until it exits)
    assert done.exists(), f"make returned before the wrapper's resume finished ({sig.name})"
    make.communicate(timeout=120)


def test_the_playbook_dies_with_its_wrapper(tmp_path):
    child = [sys.executable, "-c", "import os, time; print(os.getpid(), flush=True); time.sleep(600)"]
    wrapper = subprocess.Popen([sys.executable, "-c", "import os, sys; from ddtree_ops.play import _run; "
                                f"_run({child!r}, dict(os.environ))"], cwd=REPO, stdout=subprocess.PIPE, text=True)
    pid = int(wrapper.stdout.readline())
    try:
        assert _alive(pid)
        wrapper.kill()  # kill -9: no handler of the wrapper's runs
        wrapper.wait(timeout=30)
        deadline = time.monotonic() + 60
        while _alive(pid):
            assert time.monotonic() < deadline, "the wrapper's child outlived it"
            time.sleep(0.1)
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_killed_playbook_is_reported_as_killed(tmp_path, monkeypatch, capsys):
    """A playbook that died of a signal (here SIGKILL) is not "a host could not be reached"; the resume runs."""
    from ddtree_ops import play

    fake = tmp_path / "ansible-playbook"
    fake.write_text(f"#!{sys.executable}\nimport os, signal, sys\n"
                    "sys.exit(0) if 'playbooks/resume.yml' in sys.argv else os.kill(os.getpid(), signal.SIGKILL)\n")
    fake.chmod(0o755)
    monkeypatch.setattr(play, "_ansible_playbook", lambda: str(fake))
    rc = play.main(["playbooks/deploy.yml", "--limit", "gpu-x"])
    err = capsys.readouterr().err
    assert rc == 128 + signal.SIGKILL, err
    assert "stopped (ansible-playbook was killed by SIGKILL): running playbooks/resume.yml" in err, err
    assert "could not be reached" not in err
