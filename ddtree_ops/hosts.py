"""Read-only operations on a deployed host over SSH (Fabric): status, logs, an endpoint tunnel.

Ansible stays the only thing that changes a host. Hosts and how to reach them come from the
Ansible inventory (one list of hosts), read through Ansible itself; host keys are checked against
~/.ssh/known_hosts and the inventory's UserKnownHostsFile, and an unknown host is refused. The
root fabfile.py exposes these as `fab status|logs|tunnel`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import paramiko
from fabric import Connection

REPO = Path(__file__).resolve().parents[1]  # the checkout: ansible.cfg and inventory/ are read from it
DEFAULT_INVENTORY = "inventory/production/hosts.yml"
TEST_INVENTORY = "inventory/test"
LOCAL_TEST_HOST = "ct-test-1"  # what `make deploy` with no HOST deploys to
# Where `make testhost` records its host; a test run names its own folder in DDTREE_TESTHOST_DIR (inventory/test).
TESTHOST_DIR = REPO / ".cache" / "testhosts"
TESTHOST_DOWN = "the local test host is down: `make deploy` or `make testhost-up` brings it up"
ROOT = "/srv/ddtree"
SERVICE = "sglang-ddtree"


HOST_KEYS = ["inventory_hostname", "ansible_host", "ansible_user", "ansible_port", "ansible_ssh_private_key_file",
             "ansible_ssh_common_args", "ddtree_root", "ddtree_service", "ddtree_port", "ddtree_bind_address"]


def host_vars(host: str, inventory: str = DEFAULT_INVENTORY) -> dict:
    """The inventory's variables for `host`, templated by Ansible itself (no connection is made)."""
    exe = Path(sys.executable).parent / "ansible"
    msg = "{{ {" + ", ".join(f"'{k}': {k} | default('')" for k in HOST_KEYS) + "} }}"
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.minimal", "ANSIBLE_CALLBACK_RESULT_FORMAT": "json"}
    proc = subprocess.run([str(exe), "-i", inventory, host, "-m", "ansible.builtin.debug", "-a", f"msg={msg}"],
                          cwd=REPO, capture_output=True, text=True, env=env)
    try:  # minimal callback: "HOST | SUCCESS => {json}"
        result = json.loads(proc.stdout.split("=>", 1)[1])["msg"]
    except (ValueError, KeyError, IndexError):
        raise SystemExit(f"host {host!r} is not in {inventory} (or its variables do not resolve): "
                         f"{(proc.stderr or proc.stdout).strip()[-400:]}") from None
    return {k: v for k, v in result.items() if v != ""}


def is_test_inventory(inventory: str | None) -> bool:
    """Whether `inventory` is the local test hosts' (inventory/test, or a file in it), however it is written."""
    if not inventory:
        return False
    path = Path(inventory) if Path(inventory).is_absolute() else REPO / inventory
    test = (REPO / TEST_INVENTORY).resolve()
    return path.resolve() == test or test in path.resolve().parents


def test_host_down(host: str, inventory: str | None = None) -> str | None:
    """Why local test host `host` is not there, found without sending anything: no network namespace for it (from
    the hosts file its maker wrote), so its address would leave through the default route and something else
    could answer. A host is a local test host by its name (ct-test-*) or by the inventory it is read from
    (inventory/test). None when it is up, or when `host` is not a local test host."""
    if not (host.startswith("ct-test-") or is_test_inventory(inventory)):
        return None
    state = Path(os.environ.get("DDTREE_TESTHOST_DIR") or TESTHOST_DIR) / "testhosts.json"
    try:
        netns = next((h["netns"] for h in json.loads(state.read_text()) if h.get("name") == host), None)
    except (OSError, ValueError):
        netns = None
    return None if netns and Path("/run/netns", netns).exists() else TESTHOST_DOWN


def connect(host: str, inventory: str = DEFAULT_INVENTORY) -> tuple[Connection, dict]:
    down = test_host_down(host, inventory)
    if down:
        raise SystemExit(f"{host}: {down}")
    hv = host_vars(host, inventory)
    address = hv.get("ansible_host", host)
    if "CHANGE-ME" in str(address) or "CHANGE-ME" in str(hv.get("ansible_user", "")):
        raise SystemExit(f"{host}: fill in ansible_host and ansible_user in {inventory} first")
    kwargs = {}
    key = hv.get("ansible_ssh_private_key_file")
    if key and "{{" not in key:
        kwargs["key_filename"] = key
    conn = Connection(address, user=hv.get("ansible_user"), port=int(hv.get("ansible_port", 22)), connect_kwargs=kwargs)
    # Fabric accepts unknown host keys by default; this repository never does.
    conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
    conn.client.load_system_host_keys()
    m = re.search(r"UserKnownHostsFile=(\S+)", str(hv.get("ansible_ssh_common_args", "")))
    if m and Path(m.group(1)).exists():
        conn.client.load_host_keys(m.group(1))
    return conn, hv


def _root(hv: dict) -> str:
    return hv.get("ddtree_root", ROOT)


def _service(hv: dict) -> str:
    return hv.get("ddtree_service", SERVICE)


def status_report(conn: Connection, hv: dict) -> tuple[str, bool]:
    """Text of `fab status` (current release, markers of each release, service state, the release the server
    process runs, GPUs, server info) and whether the host serves: the service active and the server answering."""
    root = shlex.quote(_root(hv))
    lines = []
    quiet = {"hide": True, "warn": True, "in_stream": False}  # no stdin: fab runs in scripts and tests too
    current = conn.run(f"readlink {root}/current || echo none", **quiet).stdout.strip()
    lines.append(f"current: {current}")
    problems = []
    if current != "none" and not conn.run(f"test -d {root}/current", **quiet).ok:
        problems.append(f"current names {current.removeprefix('releases/')}, whose release folder is gone (removed by "
                        "hand?): nothing can start from it; `make rollback HOST=...` puts back a verified release")
    elif current != "none":
        if not conn.run(f"test -e {root}/current/.verified", **quiet).ok:
            problems.append(f"current names {current.removeprefix('releases/')}, which never passed health and "
                            "smoke: a restart would start it (the next `make deploy` or `make rollback` puts back a "
                            "verified release)")
        record = conn.run(f"{root}/current/venv/bin/ddtree-ops venv-record check", **quiet)
        lines.append("venv: " + ("matches its record" if record.ok else "DIFFERS FROM ITS RECORD"))
        if not record.ok:
            named = [line.removeprefix("MODIFIED: ") for line in record.stdout.splitlines()]
            problems += named or [record.stderr.strip()]
    listing = conn.run(f"cd {root}/releases 2>/dev/null && for r in *; do [ -d \"$r\" ] && "
                       f"echo \"$r $(ls -A $r | grep -E '^\\.(complete|verified|failed)$' | tr -d . | tr '\\n' ' ')\"; "
                       "done", hide=True, warn=True, in_stream=False).stdout.strip()
    lines.append("releases:")
    lines += [f"  {row}" for row in listing.splitlines()] or ["  none"]
    active = conn.run(f"systemctl is-active {_service(hv)}", **quiet).stdout.strip() or "unknown"
    lines.append(f"service {_service(hv)}: {active}")
    serving = conn.run(f"pid=$(systemctl show -p MainPID {_service(hv)} | cut -d= -f2); [ \"${{pid:-0}}\" != 0 ] && "
                       "tr '\\0' '\\n' < /proc/$pid/environ | sed -n 's/^DDTREE_RELEASE_ID=//p'", **quiet)
    lines.append(f"server process runs release: {serving.stdout.strip() or 'none (or unreadable: needs root)'}")
    gpus = conn.run("nvidia-smi --query-gpu=index,name,compute_cap,memory.used,utilization.gpu --format=csv,noheader",
                    hide=True, warn=True, in_stream=False)
    lines.append("gpus: " + (gpus.stdout.strip().replace("\n", "\n      ") if gpus.ok else "nvidia-smi not available"))
    port = hv.get("ddtree_port", 30000)
    address = hv.get("ddtree_bind_address", "127.0.0.1")
    address = "127.0.0.1" if address in ("0.0.0.0", "::", "") else address
    probe = ("import json, urllib.request; "
             f"print(json.dumps(json.load(urllib.request.urlopen('http://{address}:{port}/server_info', timeout=5))))")
    info = conn.run(f"python3 -c {shlex.quote(probe)}", hide=True, warn=True, in_stream=False)
    if info.ok:
        data = json.loads(info.stdout)
        accept = (data.get("internal_states") or [{}])[0].get("avg_spec_accept_length")
        lines.append(f"server: SGLang {data.get('version')}, {data.get('speculative_algorithm')}, "
                     f"accept length {accept}")
    else:
        lines.append(f"server: no answer on {address}:{port}")
    lines += [f"PROBLEM: {p}" for p in problems]
    ok = active == "active" and info.ok and not problems
    if problems and active == "active" and info.ok:
        lines.append("SERVING, NOT IN ORDER: the PROBLEM lines above; `make deploy HOST=...` puts it right "
                     "(-e ddtree_venv_rebuild=true for a venv that differs from its record)")
    elif not ok:
        lines.append(f"NOT SERVING: see `fab logs --host {hv.get('inventory_hostname', 'HOST')}`; roll back with "
                     f"`make rollback HOST=...` or redeploy with `make deploy HOST=...`")
    return "\n".join(lines), ok


def reach_hint(host: str, hv: dict, exc: Exception) -> str:
    """One line for a host that cannot be reached: which address, why, and how to bring it up."""
    where = f"{hv.get('ansible_host', host)}:{hv.get('ansible_port', 22)}"
    fix = TESTHOST_DOWN if host.startswith("ct-test-") else "check that the host is up and that ssh reaches it"
    return f"cannot reach {host} at {where} ({type(exc).__name__}: {str(exc)[:160]}): {fix}"


def target(host: str, inventory: str) -> tuple[str, str]:
    """No host: the local test host, as `make deploy` with no HOST; a test host name: the test inventory."""
    host = host or LOCAL_TEST_HOST
    if host.startswith("ct-test-") and inventory == DEFAULT_INVENTORY:
        inventory = TEST_INVENTORY
    return host, inventory


def logs_text(conn: Connection, hv: dict, lines: int = 200) -> str:
    """journald where systemd runs; the file docker-systemctl-replacement writes elsewhere."""
    svc = _service(hv)
    cmd = (f"if [ -d /run/systemd/system ]; then journalctl -u {svc} -n {lines} --no-pager; "
           f"else tail -n {lines} /var/log/journal/{svc}.service.log; fi")
    return conn.run(cmd, hide=True, warn=True, in_stream=False).stdout


@contextlib.contextmanager
def open_tunnel(conn: Connection, hv: dict, local_port: int) -> Iterator[str]:
    """Forward 127.0.0.1:local_port here to the endpoint's bind address and port on the host."""
    address = hv.get("ddtree_bind_address", "127.0.0.1")
    address = "127.0.0.1" if address in ("0.0.0.0", "::", "") else address
    with conn.forward_local(local_port, remote_port=int(hv.get("ddtree_port", 30000)), remote_host=address):
        # Fabric binds the local port in a thread of its own: wait until it listens.
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", local_port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"the tunnel did not open 127.0.0.1:{local_port}") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{local_port}"


# `python -m ddtree_ops.hosts guard HOST [INVENTORY]`: what the Makefile runs before any command reaches a host.
if __name__ == "__main__":
    if len(sys.argv) not in (3, 4) or sys.argv[1] != "guard":
        raise SystemExit("usage: python -m ddtree_ops.hosts guard HOST [INVENTORY]")
    if why := test_host_down(sys.argv[2], sys.argv[3] if len(sys.argv) == 4 else None):
        raise SystemExit(f"{sys.argv[2]}: {why}")
