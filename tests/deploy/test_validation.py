"""Bad settings stop the deploy before any host is touched, with a message naming the variable.

These plays fail in validation, which runs on the controller: no test host is needed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddtree_ops import hosts as remote

REPO = Path(__file__).resolve().parents[2]


def _deploy(inventory: str, limit: str, extra: dict | None = None) -> subprocess.CompletedProcess:
    bindir = Path(sys.executable).parent
    cmd = [str(bindir / "ansible-playbook"), "-i", inventory, "playbooks/deploy.yml", "--limit", limit]
    if extra:
        cmd += ["-e", json.dumps(extra)]
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "PATH": f"{bindir}:{os.environ['PATH']}", "DDTREE_TESTHOST_DIR": "/nonexistent"}
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_missing_test_host_source_is_named():
    """make deploy with no HOST before the test host (and its DDTree repository) exists."""
    proc = _deploy("inventory/test", "ct-test-1")
    assert proc.returncode != 0
    assert "not-made-yet:run-make-testhost" in proc.stdout + proc.stderr


@pytest.mark.parametrize(("extra", "names"), [
    ({"ddtree_port": "not-a-port"}, ["ddtree_port"]),
    ({"ddtree_verify_kernel": "flashinfer"}, ["ddtree_verify_kernel", "ddtree, sglang"]),
    ({"ddtree_page_size": 16}, ["ddtree_page_size"]),
    ({"ddtree_sglang_version": ">=0.5.20"}, ["ddtree_sglang_version"]),
    ({"ddtree_sglang_version": "", "ddtree_sglang_git_url": "https://example.invalid/sglang.git",
      "ddtree_sglang_git_commit": "main"}, ["ddtree_sglang_git_commit", "40-hex"]),
    ({"ddtree_releases_keep": 1}, ["ddtree_releases_keep"]),
    ({"ddtree_env": {"BAD NAME": "x"}}, ["ddtree_env"]),
    ({"ddtree_releases_keep": "1"}, ["ddtree_releases_keep must be at least 2"]),  # a string, as -e gives it
    ({"ddtree_model_path": ""}, ["empty value after --model-path", "ddtree_model_path"]),
    ({"ddtree_kv_cache_dtype": "fp16"}, ["ddtree_kv_cache_dtype", "auto, bfloat16, fp8_e4m3"]),
    # a setting the role owns, given again in the extra arguments (either spelling): named, with its variable
    ({"ddtree_server_args_extra": ["--kv-cache-dtype=fp8_e4m3"]}, ["--kv-cache-dtype", "ddtree_kv_cache_dtype"]),
    ({"ddtree_server_args_extra": ["--speculative-ddtree-budget", "16"]}, ["ddtree_budget"]),
])
def test_bad_setting_fails_naming_the_variable(extra, names):
    # No test host here, so no DDTree git repository either: a well-formed commit stands for it.
    proc = _deploy("inventory/test", "ct-test-1", {"ddtree_sglang_git_commit": "a" * 40, **extra})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "UNREACHABLE" not in out, "validation must fail before connecting"
    for name in names:
        assert name in out, out[-3000:]


def test_production_placeholders_are_refused():
    proc = _deploy("inventory/production/hosts.yml", "ct200")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "CHANGE-ME placeholder" in out and "inventory/production/hosts.yml" in out
    assert "UNREACHABLE" not in out


def test_a_missing_inventory_fails():
    proc = _deploy("inventory/nope.yml", "ct200")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "inventory/nope.yml" in out


def test_make_names_a_missing_inventory_and_bench_defaults_to_the_test_host():
    proc = subprocess.run(["make", "--no-print-directory", "check", "HOST=ct200", "INVENTORY=inventory/nope.yml"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0 and "no inventory at inventory/nope.yml" in proc.stdout + proc.stderr
    dry = subprocess.run(["make", "--no-print-directory", "-n", "bench"], cwd=REPO, capture_output=True, text=True)
    assert "--endpoint http://10.213.1.2:30000" in dry.stdout  # the local test host, as smoke-test and check


def _make(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})


DOWN = {"DDTREE_TESTHOST_DIR": "/nonexistent"}  # no test-host record: the local test host is down


@pytest.mark.parametrize("target", ["smoke-test", "check", "rollback", "bench"])
def test_tools_stop_before_reaching_a_test_host_that_is_down(target, tmp_path):
    """With no HOST these act on the local test host; its address would leave through the default route if its
    namespace is not there, so they stop first, naming how to bring it up: no play starts, no request goes out."""
    proc = _make(target, env=DOWN)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "the local test host is down: `make deploy` or `make testhost-up` brings it up" in out, out[-2000:]
    assert "PLAY [" not in out and "Traceback" not in out and "ConnectionRefused" not in out


# What a local deploy prints as its rollback hint, and smoke-test with the same arguments; and a test-inventory host
# under another name: each is a local test host however it is named.
NAMED = [("rollback", "HOST=ct-test-1", "INVENTORY=inventory/test"), ("smoke-test", "HOST=ct-test-1",
         "INVENTORY=inventory/test"), ("check", "HOST=ct-test-2", "INVENTORY=inventory/test"),
         ("rollback", "HOST=ct-test-1", "INVENTORY=./inventory/test/hosts.yml")]


@pytest.mark.parametrize("command", NAMED, ids=[" ".join(c) for c in NAMED])
def test_a_test_host_named_with_host_and_inventory_is_guarded_too(command):
    proc = _make(*command, env=DOWN)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "the local test host is down" in out, out[-2000:]
    assert "PLAY [" not in out and "Traceback" not in out


def test_the_guard_knows_a_test_host_by_its_inventory():
    assert remote.test_host_down("ct200") is None  # a production host: nothing to check
    assert remote.test_host_down("gpu-a", "inventory/production/hosts.yml") is None
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DDTREE_TESTHOST_DIR", "/nonexistent")
        assert remote.test_host_down("gpu-a", "inventory/test") == remote.TESTHOST_DOWN
        assert remote.test_host_down("gpu-a", str(REPO / "inventory/test/hosts.yml")) == remote.TESTHOST_DOWN


def test_fab_stops_before_reaching_a_test_host_that_is_down():
    bindir = Path(sys.executable).parent
    proc = subprocess.run([str(bindir / "fab"), "status"], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **DOWN})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "ct-test-1: the local test host is down" in out and "cannot reach" not in out


def test_bench_with_a_host_and_no_endpoint_is_refused_clearly():
    proc = _make("bench", "HOST=ct200")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "give ENDPOINT=" in out and "fab tunnel --host ct200" in out


def test_a_commit_the_repository_lacks_is_named_first(tmp_path):
    """A pinned commit the repository does not have: the bundle's error leads with git's own line and the fix
    (real pip and git over a file:// repository), not with pip's argument vector."""
    from ddtree_ops.bundle import BundleError, _pip

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "setup.py").write_text("from setuptools import setup\nsetup(name='x', version='1')\n")
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "x"]):
        subprocess.run([*git, *args], check=True, capture_output=True)
    bad = "1" * 40
    with pytest.raises(BundleError) as err:
        _pip(["wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "w"),
              f"x @ git+file://{repo}@{bad}"], "building SGLang")
    first = str(err.value).splitlines()[0]
    assert first.startswith("building SGLang failed (pip exit 1): ") and bad in first, str(err.value)
    assert "ddtree_sglang_git_commit" in first and "command:" not in first
