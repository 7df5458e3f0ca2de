"""Read-mostly operations on a GPU host (Fabric). Ansible stays the only thing that changes one.

    fab status --host ct200            release, markers, service state, GPUs, /server_info
    fab status                         the same for the local test host ct-test-1 (make deploy with no HOST)
    fab logs --host ct200 [--lines 200]
    fab tunnel --host ct200 [--local-port 30000]   forward the endpoint to this machine

Hosts and how to reach them come from the Ansible inventory (`--inventory`, default
inventory/production/hosts.yml), so there is one list of hosts. Host keys are checked against
~/.ssh/known_hosts and the inventory's UserKnownHostsFile; an unknown host is refused.
"""

from __future__ import annotations

import contextlib
import socket
import time

import paramiko
from fabric import task

from ddtree_ops.hosts import (
    DEFAULT_INVENTORY,
    LOCAL_TEST_HOST,
    TEST_INVENTORY,
    connect,
    logs_text,
    open_tunnel,
    reach_hint,
    status_report,
    target,
)

# What a host that is down (or not there yet) raises on the first command.
UNREACHABLE = (OSError, socket.timeout, paramiko.SSHException)


@task(help={"host": f"inventory host name (default {LOCAL_TEST_HOST}, the local test host)",
            "inventory": f"inventory file (default {DEFAULT_INVENTORY}; {TEST_INVENTORY} for ct-test-*)"})
def status(c, host="", inventory=DEFAULT_INVENTORY):
    """Current release, release markers, service state, GPUs and /server_info of one host; exits 1 unless it serves."""
    host, inventory = target(host, inventory)
    conn, hv = connect(host, inventory)
    try:
        text, ok = status_report(conn, hv)
    except UNREACHABLE as exc:
        raise SystemExit(reach_hint(host, hv, exc)) from None
    print(text)
    if not ok:
        raise SystemExit(1)


@task(help={"host": "inventory host name", "lines": "how many lines (default 200)"})
def logs(c, host="", lines=200, inventory=DEFAULT_INVENTORY):
    """The server's last log lines (journald; the test hosts' systemctl writes a file)."""
    host, inventory = target(host, inventory)
    conn, hv = connect(host, inventory)
    try:
        print(logs_text(conn, hv, int(lines)))
    except UNREACHABLE as exc:
        raise SystemExit(reach_hint(host, hv, exc)) from None


@task(help={"host": "inventory host name", "local_port": "port on this machine (default 30000)"})
def tunnel(c, host="", local_port=30000, inventory=DEFAULT_INVENTORY):
    """Forward the host's endpoint to localhost:LOCAL_PORT until Ctrl-C."""
    host, inventory = target(host, inventory)
    conn, hv = connect(host, inventory)
    with open_tunnel(conn, hv, int(local_port)) as url:
        print(f"{url} -> {host}'s endpoint (Ctrl-C to stop)")
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)
