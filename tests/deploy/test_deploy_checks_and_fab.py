"""What a deploy checks on the host before it switches (the kernel self-check, a DSA checkpoint's launch and
sparse self-check, the venv against its record), then the read-only Fabric tasks (ddtree_ops.hosts, `fab`)
against what it deployed: the real playbooks over SSH against this file's own two local test hosts.

A file of its own so that `make test` (--dist loadfile) runs it on the other worker beside test_deploy.py. Its
cases run in file order and build on each other; the first one deploys the NEW DDTree commit on ct-test-1
(refused, then through the fallback to SGLang's kernel), which the DSA case deploys over (on ours again) and
leaves as usual for the others.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import paramiko
import pytest
import requests

from ddtree_ops import hosts as remote
from tests.support import testhost

from .conftest import H1, NEW, REPO, ROOT, Hosts, deployed


def test_a_failing_kernel_self_check_refuses_or_falls_back_to_sglang(hosts: Hosts):
    before = hosts.state(H1)
    bad = {**hosts.source(NEW), "ddtree_selfcheck": True, "ddtree_selfcheck_heads": 0, "ddtree_budget": 6}
    refused = hosts.play("deploy.yml", limit=H1, extra=bad)
    text = " ".join(refused.output.split())
    assert refused.rc != 0 and "ddtree_kernels computed wrong" in text and "was not switched to" in text
    assert hosts.state(H1)["pids"] == before["pids"]
    fallback = hosts.play("deploy.yml", limit=H1, extra={**bad, "ddtree_selfcheck_fallback": "sglang"})
    assert fallback.rc == 0, fallback.output[-3000:]
    assert "WARNING: ddtree_kernels computed wrong" in " ".join(fallback.output.split())
    st = deployed(hosts, H1, NEW)
    assert st["info"]["verify_kernel"] == "sglang"  # the next test's first switch goes back to ddtree_kernels


def _glm5_checkpoint() -> Path:
    """GLM-5's config.json (tests/server_gpu/models.py) in a folder the hosts' server user can read."""
    from tests.server_gpu.models import target_config

    folder = Path(tempfile.mkdtemp(prefix="glm5-", dir="/tmp")) / "GLM-5"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(target_config()))
    for path in (folder.parent, folder):
        path.chmod(0o755)
    return folder


def _launched_model(hosts: Hosts, host: str) -> str:
    argv = json.loads(hosts.sh(host, f"cat {ROOT}/current/launch.json"))["argv"]
    return argv[argv.index("--model-path") + 1]


def test_a_dsa_checkpoint_is_served_sparse_or_through_the_dense_view(hosts: Hosts):
    """ddtree_dsa_attention on GLM-5's config: `dsa` passes the launch check of the release's own patched SGLang
    (patch 0007 found in its source) only with a bf16 cache, runs the DSA self-check and a smoke test that needs
    every verify served sparse; `dense-view` launches from the dense-MLA view."""
    model = _glm5_checkpoint()
    before = hosts.state(H1)
    base = {**hosts.source(NEW), "ddtree_model_path": str(model), "ddtree_budget": 14, "ddtree_selfcheck": True}
    try:
        # The self-check runs where it is what the play tests (the sparse one); the others are refused or
        # switched by the launch alone.
        refused = hosts.play("deploy.yml", limit=H1, extra={**base, "ddtree_kv_cache_dtype": "auto",
                                                              "ddtree_selfcheck": False})
        text = " ".join(refused.output.split())
        assert refused.rc != 0 and "--kv-cache-dtype auto (needs bfloat16" in text, text[-3000:]
        assert "ddtree_dsa_attention: dense-view" in text and hosts.state(H1)["pids"] == before["pids"]

        sparse = hosts.play("deploy.yml", limit=H1, extra={**base, "ddtree_kv_cache_dtype": "bfloat16"})
        assert sparse.rc == 0, sparse.output[-4000:]
        deployed(hosts, H1, NEW)
        # a deploy after the previous test's fallback to SGLang's kernel is back on ours
        assert json.loads(hosts.sh(H1, f"cat {ROOT}/current/manifest.json"))["verify_kernel"] == "ddtree"
        assert _launched_model(hosts, H1) == str(model)
        smoke = hosts.sh(H1, f"cat {ROOT}/current/.verified")
        assert "PASS  TARGET_VERIFY served by ddtree_kernels (sparse DSA)" in smoke, smoke

        dense = hosts.play("deploy.yml", limit=H1, extra={**base, "ddtree_kv_cache_dtype": "bfloat16",
                                                            "ddtree_dsa_attention": "dense-view",
                                                            "ddtree_selfcheck": False})
        assert dense.rc == 0, dense.output[-4000:]
        deployed(hosts, H1, NEW)
        assert _launched_model(hosts, H1) == f"{ROOT}/shared/models/GLM-5-dense-mla"
        assert "(sparse DSA)" not in hosts.sh(H1, f"cat {ROOT}/current/.verified")
    finally:
        restore = hosts.play("deploy.yml", "-e", "ddtree_budget=14", limit=H1, extra=hosts.source(NEW))
        shutil.rmtree(model.parent, ignore_errors=True)
    assert restore.rc == 0, restore.output[-3000:]


def test_an_edited_venv_is_refused_until_rebuilt(hosts: Hosts, test_inventory):
    """A hand edit to a patched SGLang file in the serving release's venv: fab status names it, the next deploy
    that would reuse the venv refuses (nothing switched), and -e ddtree_venv_rebuild=true builds it again,
    restarts the server on it and smoke-tests it like any switch."""
    before = deployed(hosts, H1, NEW)
    site = hosts.sh(H1, f"ls -d {ROOT}/current/venv/lib/python3*/site-packages")
    edited = "sglang/srt/speculative/dflash_utils.py"
    hosts.sh(H1, f"echo '# a hand edit' >> {site}/{edited}")
    conn, hv = remote.connect(H1, "inventory/test")
    report, ok = remote.status_report(conn, hv)
    assert not ok and f"PROBLEM: {edited}: changed since the venv was built" in report, report
    refused = hosts.play("deploy.yml", "-e", "ddtree_budget=14", limit=H1, extra=hosts.source(NEW))
    text = " ".join(refused.output.split())
    assert refused.rc != 0 and "differs from its record" in text and f"{edited}: changed" in text, text[-3000:]
    assert "Nothing was switched" in text and "ddtree_venv_rebuild=true" in text
    assert hosts.state(H1)["pids"] == before["pids"]
    rebuilt = hosts.play("deploy.yml", "-e", "ddtree_budget=14", "-e", "ddtree_venv_rebuild=true", limit=H1,
                         extra=hosts.source(NEW))
    assert rebuilt.rc == 0, rebuilt.output[-4000:]
    assert "# a hand edit" not in hosts.sh(H1, f"tail -1 {site}/{edited}")
    after = deployed(hosts, H1, NEW)
    assert remote.status_report(conn, hv)[1]
    # the process that had loaded the edited code was replaced, and the rebuilt release was smoke-tested
    assert after["pids"] != before["pids"], "the server still runs the code it loaded before the rebuild"
    smoke = rebuilt.output.split("TASK [ddtree : Smoke-test the endpoint", 1)[-1].split("TASK [", 1)[0]
    assert "skipping" not in smoke and "ok: [ct-test-1]" in smoke, rebuilt.output[-3000:]


def test_what_the_operator_reads_names_the_cause(hosts: Hosts, test_inventory):
    """A failing preflight lists only the check that fails, with its fix; a corrupt manifest.json stops the run
    naming the file (not a templating error); a `current` whose release folder is gone is called that, by fab
    status and by the play that puts it right."""
    before = deployed(hosts, H1, NEW)
    low = hosts.play("deploy.yml", "-e", "ddtree_budget=14", "-e", "ddtree_min_free_disk_gb=1000000", limit=H1,
                     extra=hosts.source(NEW))
    text = " ".join(low.output.split())
    assert low.rc != 0 and "GB free under" in text and "ddtree_min_free_disk_gb 1000000" in text, text[-3000:]
    assert "venv support" not in text and "Python 3" not in text.split("Host preflight failed", 1)[-1][:400]
    assert hosts.state(H1)["pids"] == before["pids"]

    other = next(r for r in before["releases"] if r != before["current"])
    manifest = f"{ROOT}/releases/{other}/manifest.json"
    hosts.sh(H1, f"cp {manifest} {manifest}.good && echo '{{not json' > {manifest}")
    try:
        corrupt = hosts.play("rollback.yml", limit=H1)
        text = " ".join(corrupt.output.split())
        assert corrupt.rc != 0 and f"{manifest} cannot be read (JSONDecodeError" in text, text[-3000:]
        assert "template error" not in text.lower() and "nothing was changed" in text
        assert hosts.state(H1)["current"] == before["current"]
    finally:
        hosts.sh(H1, f"mv {manifest}.good {manifest}")

    hosts.sh(H1, f"ln -sfn releases/r-removed {ROOT}/current")  # as if its folder had been deleted
    try:
        conn, hv = remote.connect(H1, test_inventory)
        report, ok = remote.status_report(conn, hv)
        assert not ok and "current names r-removed, whose release folder is gone" in report, report
        assert "No such file" not in report and "never passed" not in report
        put_back = hosts.play("resume.yml", limit=H1)
        text = " ".join(put_back.output.split())
        assert put_back.rc == 0 and "current named release r-removed, whose folder is gone" in text, text[-3000:]
        assert f"current is back on verified release {before['current']}, healthy" in text
    finally:
        hosts.sh(H1, f"ln -sfn releases/{before['current']} {ROOT}/current")
    assert hosts.state(H1)["current"] == before["current"] and hosts.state(H1)["health"] == 200


# -- remote.py ----------------------------------------------------------------------------

def test_status_reports_what_is_on_the_host(hosts: Hosts, test_inventory):
    state = hosts.state("ct-test-1")
    conn, hv = remote.connect("ct-test-1", test_inventory)
    assert hv["ansible_host"] == hosts["ct-test-1"].address and hv["ansible_port"] in (2222, "2222")
    report, serving = remote.status_report(conn, hv)
    assert serving == (state["health"] == 200)
    current = state["current"]
    assert f"current: {'releases/' + current if current else 'none'}" in report
    for rid, markers in state["releases"].items():
        assert any(line.strip().startswith(rid) and all(m in line for m in markers) for line in report.splitlines())
    if state["info"]:
        assert f"server: SGLang {state['info']['version']}, DDTREE" in report
    assert "gpus: nvidia-smi not available" in report  # a test host has no GPU


def test_fab_with_no_host_acts_on_the_local_test_host(hosts: Hosts, test_inventory):
    """`make deploy` with no HOST deploys ct-test-1; `fab status` with no --host reports that same host."""
    bindir = Path(sys.executable).parent
    proc = subprocess.run([str(bindir / "fab"), "status"], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"current: releases/{hosts.state(H1)['current']}" in proc.stdout


def test_fab_status_fails_when_the_host_does_not_serve(hosts: Hosts, test_inventory):
    bindir = Path(sys.executable).parent
    fab = [str(bindir / "fab"), "status", "--host", H1, "--inventory", "inventory/test"]
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}
    hosts.sh(H1, "systemctl stop sglang-ddtree")
    try:
        down = subprocess.run(fab, cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
        assert down.returncode == 1, down.stdout + down.stderr
        assert "NOT SERVING" in down.stdout and "service sglang-ddtree: inactive" in down.stdout
    finally:
        hosts.sh(H1, "systemctl start sglang-ddtree")
    deadline = time.monotonic() + 30
    while hosts.state(H1)["health"] != 200:
        assert time.monotonic() < deadline
        time.sleep(1)
    up = subprocess.run(fab, cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    assert up.returncode == 0 and f"server process runs release: {hosts.state(H1)['current']}" in up.stdout


def test_an_unreachable_test_host_is_named_with_how_to_bring_it_up():
    hint = remote.reach_hint("ct-test-1", {"ansible_host": "10.213.1.2", "ansible_port": 2222},
                             ConnectionRefusedError(111, "Connection refused"))
    assert "cannot reach ct-test-1 at 10.213.1.2:2222" in hint and "make testhost" in hint


def test_unknown_host_key_is_refused(hosts: Hosts, tmp_path, monkeypatch):
    # The same inventory, but a known_hosts without the test host's key (and no ~/.ssh either).
    for name in ("id_ed25519", testhost.SUBNET_FILE, testhost.STATE_FILE):  # the record says the host is up
        shutil.copy(hosts.workdir / name, tmp_path / name)
    (tmp_path / "known_hosts").write_text("")
    monkeypatch.setenv("DDTREE_TESTHOST_DIR", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path))
    conn, _ = remote.connect("ct-test-1", "inventory/test")
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        conn.run("true", hide=True, in_stream=False)


def test_logs_and_tunnel(hosts: Hosts, test_inventory):
    conn, hv = remote.connect("ct-test-1", test_inventory)
    assert "stand-in SGLang" in remote.logs_text(conn, hv, 50)  # the server's own start-up line
    port = _free_port()
    with remote.open_tunnel(conn, hv, port) as url:
        assert requests.get(f"{url}/health_generate", timeout=10).status_code == 200


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
