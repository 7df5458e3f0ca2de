"""Two throwaway test hosts for the whole deploy suite, and helpers to run the real playbooks
against them over SSH and to read back what is on each host."""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests

from tests.support import testhost

REPO = Path(__file__).resolve().parents[2]
ROOT = "/srv/ddtree"
UNIT = "/etc/systemd/system/sglang-ddtree.service"
OLD, NEW = "ddtree-v2", "ddtree-v2-next"  # two commits of the DDTree branch (testhost.make_git_sources)
H1, H2 = "ct-test-1", "ct-test-2"


@dataclass
class PlayResult:
    rc: int
    output: str
    recap: dict[str, dict[str, int]]

    def changed(self, host: str) -> int:
        return self.recap.get(host, {}).get("changed", 0)


def _parse_recap(output: str) -> dict[str, dict[str, int]]:
    recap = {}
    for line in output.split("PLAY RECAP")[-1].splitlines():
        m = re.match(r"^(\S+)\s+:\s+(.*)$", line.strip())
        if m:
            recap[m.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
    return recap


@dataclass
class Hosts:
    workdir: Path
    hosts: list[testhost.TestHost]
    api_key: dict[str, str] = field(default_factory=dict)  # host -> the key its server was deployed with

    def source(self, name: str) -> dict[str, str]:
        """Extra vars that pin DDTree source `name` (a snapshot made a git repository by testhost.up)."""
        # -next: a later commit of the same branch. Resolved: the run's shared copy (_shared_sources), one URL for
        # every worker, so the bundle cache (keyed by URL and commit) builds each commit's SGLang once a run.
        repo = (self.workdir / "sglang-git").resolve() / name.removesuffix("-next")
        return {"ddtree_sglang_version": "", "ddtree_sglang_git_url": f"file://{repo}",
                "ddtree_sglang_git_commit": self.commit(name)}

    def commit(self, name: str) -> str:
        return (self.workdir / "sglang-git" / f"{name}.commit").read_text().strip()

    def version(self, name: str) -> str:
        """The version SGLang built from DDTree source `name` reports (bundle.git_wheel_version)."""
        from ddtree_ops.bundle import git_wheel_version

        return git_wheel_version(self.commit(name))

    def __getitem__(self, name: str) -> testhost.TestHost:
        return next(h for h in self.hosts if h.name == name)

    def _command(self, playbook: str, args: tuple[str, ...], limit: str | None, extra: dict | None,
                 env: dict | None, wrapped: bool = False) -> tuple[list[str], dict]:
        bindir = str(Path(sys.executable).parent)
        # wrapped: through ddtree-ops play, as `make deploy` and `make rollback` run it
        runner = [sys.executable, "-m", "ddtree_ops.play"] if wrapped else [f"{bindir}/ansible-playbook"]
        cmd = [*runner, f"playbooks/{playbook}", "-i", "inventory/test", *args]
        if limit:
            cmd += ["--limit", limit]
        if extra:
            cmd += ["-e", json.dumps(extra)]
        env = {**os.environ, "DDTREE_TESTHOST_DIR": str(self.workdir), "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
               "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0", "PATH": f"{bindir}:{os.environ['PATH']}",
               "PYTHONUNBUFFERED": "1", **(env or {})}
        return cmd, env

    def play(self, playbook: str, *args: str, limit: str | None = None, extra: dict | None = None,
             env: dict | None = None) -> PlayResult:
        """Run playbooks/<playbook> with the test inventory; return exit code, output and recap."""
        cmd, env = self._command(playbook, args, limit, extra, env)
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
        out = proc.stdout + proc.stderr
        (self.workdir / f"last-{playbook}.log").write_text(out)
        return PlayResult(proc.returncode, out, _parse_recap(out))

    def start(self, playbook: str, *args: str, limit: str | None = None, extra: dict | None = None,
              wrapped: bool = False) -> subprocess.Popen:
        """Start playbooks/<playbook> in the background (its own process group), output on a pipe."""
        cmd, env = self._command(playbook, args, limit, extra, None, wrapped)
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)

    def sh(self, host: str, command: str) -> str:
        return testhost.on_host(self[host], command).stdout.strip()

    def state(self, host: str) -> dict:
        """What is on the host: current, each release's markers, the unit, the serving process."""
        h = self[host]
        current = self.sh(host, f"readlink {ROOT}/current || true")
        releases = {}
        for rid in self.sh(host, f"ls {ROOT}/releases 2>/dev/null || true").split():
            markers = self.sh(host, f"ls -A {ROOT}/releases/{rid}").split()
            releases[rid] = {m.lstrip("."): True for m in markers if m in (".complete", ".verified", ".failed")}
        venvs = self.sh(host, f"ls {ROOT}/venvs 2>/dev/null || true").split()
        # No PID namespace: pick this host's server by the address it binds.
        pids = self.sh(host, f"pgrep -f '[s]glang_standin .*--host {h.address} ' || true").split()
        auth = {"Authorization": f"Bearer {self.api_key[host]}"} if host in self.api_key else {}
        try:
            info = requests.get(f"http://{h.address}:30000/server_info", headers=auth, timeout=5).json()
            health = requests.get(f"http://{h.address}:30000/health_generate", timeout=5).status_code
        except requests.RequestException:
            info, health = None, None
        # Which release the server process is, from the process itself (what the deploy reads).
        serving = self.sh(host, "pid=$(systemctl show -p MainPID sglang-ddtree | cut -d= -f2); [ -n \"$pid\" ] && "
                                "tr '\\0' '\\n' < /proc/$pid/environ | sed -n 's/^DDTREE_RELEASE_ID=//p' || true")
        lock = self.sh(host, f"cat {ROOT}/.deploy-lock/owner.json 2>/dev/null || true")
        return {"current": current.removeprefix("releases/"), "releases": releases, "venvs": venvs,
                "pids": pids, "info": info, "health": health, "serving": serving, "lock": lock}


def _shared_sources(tmp_path_factory) -> Path:
    """The stand-in wheel and the DDTree git sources, made once a test run, for every xdist worker (each file of
    test hosts runs in a worker of its own). The bundle cache keys a bundle by the git URL and the stand-in wheel's
    bytes: one copy for all lets a worker reuse the SGLang build and bundle another made (each worker used to
    build the same commit again from a repository of its own)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the run's folder, shared by its workers
    shared = base / "testhost-sources"
    with open(base / "testhost-sources.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the first worker makes them; the others wait, then reuse them
        if not (shared / "made").exists():
            shared.mkdir(exist_ok=True)
            testhost.build_standin_wheel(shared)
            testhost.make_git_sources(shared)
            (shared / "made").touch()
    return shared


@pytest.fixture(scope="session")
def hosts(tmp_path_factory) -> Hosts:
    workdir = tmp_path_factory.mktemp("testhosts")
    shared = _shared_sources(tmp_path_factory)
    for name in ("wheels", "sglang-git"):  # where the test inventory reads them (ddtree_testhost_dir)
        (workdir / name).symlink_to(shared / name)
    made = testhost.up_in_free_slot(workdir, count=2)  # its own names and subnet: runs never clash
    try:
        yield Hosts(workdir, made)
    finally:
        testhost.down(workdir, made)


@pytest.fixture
def test_inventory(hosts: Hosts, monkeypatch):
    """The test inventory, with this run's test hosts (for code that reads the inventory itself: fab, ddtree_ops)."""
    monkeypatch.setenv("DDTREE_TESTHOST_DIR", str(hosts.workdir))
    return "inventory/test"


def deployed(hosts: Hosts, host: str, version: str) -> dict:
    """The host's state, asserted in order: `version` current, verified, healthy, one server process, no lock."""
    st = hosts.state(host)
    assert st["health"] == 200, st
    assert st["info"]["version"] == hosts.version(version), st["info"]
    assert st["current"] in st["releases"], st
    assert st["releases"][st["current"]] == {"complete": True, "verified": True}, st
    assert len(st["pids"]) == 1, f"one server process expected on {host}: {st['pids']}"
    assert st["serving"] == st["current"], "the server process is not the current release"
    assert st["lock"] == "", "the deploy lock was left behind"
    return st
