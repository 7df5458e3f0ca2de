"""The test hosts' own cleanup: a run killed before its teardown leaves namespaces behind, and the next
run must be told how to remove them, and that command must remove them (and nothing else)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from ddtree_ops import hosts as remote
from tests.support import testhost


def _pids(netns: str) -> list[str]:
    return subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True).stdout.split()


def test_down_removes_what_a_killed_run_left(tmp_path):
    prefix = "ddtx"  # not the session's hosts (ddt-host<i>)
    left, other, veth = f"{prefix}-host1", f"{prefix}-hostile", f"{prefix}v1"
    for ns in (left, other):
        subprocess.run(["ip", "netns", "add", ns], check=True)
    subprocess.run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", left], check=True)
    sleeper = subprocess.Popen(["ip", "netns", "exec", left, "sleep", "600"], start_new_session=True)
    try:
        for _ in range(50):  # until the process is inside the namespace
            if _pids(left):
                break
            time.sleep(0.1)
        assert _pids(left)
        with pytest.raises(RuntimeError, match=f"{left} already exists.*make testhost-down"):
            testhost.up(tmp_path, count=1, prefix=prefix)

        assert testhost.remove_leftovers(prefix) == [left]
        assert sleeper.wait(timeout=10) != 0  # killed
        namespaces = testhost._namespaces()
        assert left not in namespaces and other in namespaces  # only up's own names
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        assert f" {veth}@" not in links and f" {veth}:" not in links
    finally:
        sleeper.kill()
        for ns in (left, other):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", veth], capture_output=True)


def test_runs_take_their_own_slots_and_the_inventory_follows(tmp_path, monkeypatch):
    """Two runs on one machine (e.g. CI next to a developer's run) get distinct namespaces and subnets, and the
    test inventory, pointed at a run's directory, reaches that run's hosts."""
    first, second = tmp_path / "a", tmp_path / "b"
    made: list[tuple] = []
    try:
        for workdir in (first, second):
            made.append((workdir, testhost.up_in_free_slot(workdir, count=1)))
        (_, [a]), (_, [b]) = made
        assert a.netns != b.netns and a.address.rsplit(".", 2)[0] != b.address.rsplit(".", 2)[0]
        assert not a.address.startswith(f"{testhost.SUBNET}.")  # `make testhost`'s hosts keep theirs
        for workdir, [host] in made:
            monkeypatch.setenv("DDTREE_TESTHOST_DIR", str(workdir))
            assert remote.host_vars("ct-test-1", "inventory/test")["ansible_host"] == host.address
            ssh = subprocess.run(["ssh", "-i", str(workdir / "id_ed25519"), "-p", str(testhost.SSH_PORT),
                                  "-o", f"UserKnownHostsFile={workdir / 'known_hosts'}",
                                  "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
                                  f"root@{host.address}", "hostname"],
                                 capture_output=True, text=True, timeout=30, env={**os.environ, "HOME": str(tmp_path)})
            assert ssh.stdout.strip() == "ct-test-1", ssh.stderr
    finally:
        ours = {h.netns: _netns_pids(h.netns) for _, hosts in made for h in hosts}
        for workdir, hosts in made:
            testhost.down(workdir, hosts)
    # Gone with everything in them. A name still listed can only be another run's (a concurrent test run may take
    # the freed slot at once): then nothing of ours runs in it.
    assert all(ours.values()), ours  # each host's sshd ran in its namespace
    listed = set(testhost._namespaces())
    for ns, pids in ours.items():
        assert not any(_running(pid) for pid in pids), (ns, pids)
        assert ns not in listed or not pids & _netns_pids(ns), ns


def _running(pid: str) -> bool:
    """Alive and not a zombie (a killed child of this process stays listed until reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _netns_pids(name: str) -> set[str]:
    return set(subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split())
