"""fabfile.py's read-only tasks over real SSH against a test host (after test_deploy.py's deploys)."""

from __future__ import annotations

import shutil

import paramiko
import pytest

import fabfile

from .conftest import Hosts

pytestmark = pytest.mark.xdist_group("testhosts")


@pytest.fixture
def test_inventory(hosts: Hosts, monkeypatch):
    monkeypatch.setenv("DDTREE_TESTHOST_DIR", str(hosts.workdir))
    return "inventory/test"


def test_status_reports_what_is_on_the_host(hosts: Hosts, test_inventory):
    state = hosts.state("ct-test-1")
    conn, hv = fabfile.connect("ct-test-1", test_inventory)
    assert hv["ansible_host"] == "10.213.1.2" and hv["ansible_port"] in (2222, "2222")
    report = fabfile.status_report(conn, hv)
    current = state["current"]
    assert f"current: {'releases/' + current if current else 'none'}" in report
    for rid, markers in state["releases"].items():
        assert any(line.strip().startswith(rid) and all(m in line for m in markers) for line in report.splitlines())
    if state["info"]:
        assert f"server: SGLang {state['info']['version']}, DDTREE" in report
    assert "gpus: nvidia-smi not available" in report  # a test host has no GPU


def test_unknown_host_key_is_refused(hosts: Hosts, tmp_path, monkeypatch):
    # The same inventory, but a known_hosts without the test host's key (and no ~/.ssh either).
    shutil.copy(hosts.workdir / "id_ed25519", tmp_path / "id_ed25519")
    (tmp_path / "known_hosts").write_text("")
    monkeypatch.setenv("DDTREE_TESTHOST_DIR", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path))
    conn, _ = fabfile.connect("ct-test-1", "inventory/test")
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        conn.run("true", hide=True)
