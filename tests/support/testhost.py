"""Throwaway local test hosts: what `make deploy` with no HOST and the deploy tests deploy to.

Each host is a network namespace joined to this machine by a veth pair, with its own sshd
(own host key, own port, key-only root login) running under `unshare --mount --uts`. Inside
that mount namespace the host gets private tmpfs on /srv, /run, /var/log and a private copy of
/etc (so the playbook's user, unit file and env file never reach this machine), and
docker-systemctl-replacement is bind-mounted over `systemctl`: it runs unit files without
systemd. Everything else (the Python installs, /usr) is this machine's, read as it is.

Teardown kills only the processes inside the test's namespaces (by PID, `ip netns pids`),
then deletes the namespaces and veth pairs, also when the test failed.

Run `python -m tests.support.testhost up` / `down` to keep hosts around by hand (make deploy with no HOST
does this) at 10.213.<i>.2, the addresses inventory/test/hosts.yml defaults to. A test run takes
the first free slot of its own (`up_in_free_slot`: namespaces `ddt<k>-host<i>`, subnet 10.<213+k>),
so test runs on one machine and a hand-made host never clash; the inventory reads a workdir's subnet
from its `subnet` file. `down` also removes the hosts of a test run that was killed before its
teardown: every `ddt[<k>]-host<i>` namespace, so a test run still going loses its hosts too. The host runs the
stand-ins of tests/endpoint/ (SGLang's HTTP server, the GPU stack for the launch check), packaged
by build_standin_wheel from this checkout: they stay under tests/, as every stand-in does.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import asdict, dataclass
from pathlib import Path

SSH_PORT = 2222
# Host i is <subnet>.i.2, this machine <subnet>.i.1; `make testhost`'s subnet, and inventory/test's default.
SUBNET = "10.213"
STATE_FILE = "testhosts.json"
SUBNET_FILE = "subnet"  # inventory/test/hosts.yml reads the hosts' subnet from here (10.213 when absent)
SLOTS = range(1, 41)  # test runs' own prefixes ddt1..ddt40 and subnets 10.214..10.253


class HostsTaken(RuntimeError):
    """A namespace `up` would create already exists (another run holds it, or a killed one left it)."""


@dataclass
class TestHost:
    name: str
    index: int
    netns: str
    veth: str
    address: str
    pid: int  # the `unshare` process holding the host's mount namespace (sshd runs in it)
    exec_prefix: list[str]  # run a command "on" the host: nsenter into its namespaces


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def _require_tools() -> None:
    missing = [t for t in ("ip", "unshare", "nsenter", "ssh-keygen", "/usr/sbin/sshd") if not shutil.which(t)]
    if missing:
        raise RuntimeError(f"test hosts need {', '.join(missing)}: run `make setup` as root (installs openssh-server)")
    if os.geteuid() != 0:
        raise RuntimeError("test hosts need root (network namespaces, mounts): run the tests as root")


def systemctl_replacement() -> Path:
    """The single-file systemctl of docker-systemctl-replacement, from the installed package."""
    import systemctl2.systemctl3 as mod  # the PyPI package docker-systemctl-replacement

    return Path(mod.__file__)


def _host_script(workdir: Path, index: int, hostname: str) -> str:
    """Shell run inside `unshare --mount --uts` in the netns: private mounts, then exec sshd."""
    etc = workdir / f"etc-{index}"
    sysctl = workdir / "systemctl"
    watchdog = workdir / "restart_watchdog.py"
    return textwrap.dedent(f"""\
        set -e
        hostname {hostname}
        for d in /srv /run /var/log; do mount -t tmpfs -o mode=755 tmpfs $d; done
        mkdir -p {etc} && mount -t tmpfs -o mode=755 tmpfs {etc} && cp -a /etc/. {etc}/
        mount --bind {etc} /etc
        mount --bind {sysctl} /usr/bin/systemctl
        mkdir -p /run/sshd /etc/systemd/system /var/log/journal
        ip link set lo up
        # systemd would restart a unit that died (Restart=on-failure); this systemctl does not supervise.
        nohup /usr/bin/python3 {watchdog} >/var/log/restart-watchdog.log 2>&1 &
        exec /usr/sbin/sshd -D -e -f {workdir}/sshd_config-{index}
    """)


def _write_keys(workdir: Path) -> None:
    for name, comment in (("id_ed25519", "ddtree-test-controller"), ("host_ed25519", "ddtree-test-host")):
        if not (workdir / name).exists():
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(workdir / name)])
    shutil.copy(workdir / "id_ed25519.pub", workdir / "authorized_keys")
    os.chmod(workdir / "authorized_keys", 0o600)


def _write_sshd_config(workdir: Path, index: int, address: str) -> None:
    (workdir / f"sshd_config-{index}").write_text(textwrap.dedent(f"""\
        Port {SSH_PORT}
        ListenAddress {address}
        HostKey {workdir}/host_ed25519
        PidFile {workdir}/sshd-{index}.pid
        AuthorizedKeysFile {workdir}/authorized_keys
        PermitRootLogin prohibit-password
        PasswordAuthentication no
        KbdInteractiveAuthentication no
        UsePAM no
        StrictModes no
        AcceptEnv LANG LC_*
        Subsystem sftp internal-sftp
    """))


def _wait_port(host: TestHost, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host.address, SSH_PORT), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"sshd on test host {host.name} ({host.address}:{SSH_PORT}) did not come up in {timeout:.0f} s; "
                       f"see {host.netns} with `ip netns exec {host.netns} ss -ltnp`")


def make_git_sources(workdir: Path) -> dict[str, str]:
    """The DDTree branch the test hosts install, as a git repository reached by file:// URL.

    workdir/sglang-git/ddtree-v2 is the ddtree-v2 snapshot (../shared/sglang-src) as one commit,
    plus a branch `next` one commit later (a changed comment), so a deploy can move from one DDTree
    commit to another as an operator's new pin does. Each commit is in <name>.commit beside it.
    (The older `ddtree` snapshot cannot be built here: its Rust extension has no opt-out and needs
    crates.io.)"""
    from ddtree_ops.ddtree_sources import git_checkout, load_sources, run_git

    source = next(s for s in load_sources() if s.name == "ddtree-v2")
    snapshot = source.snapshot_path()
    if snapshot is None:
        raise RuntimeError(f"no {source.snapshot} found: the test hosts install it (set DDTREE_SGLANG_SNAPSHOTS "
                           "to the folder holding it; it ships in ../shared/sglang-src)")
    repo = workdir / "sglang-git" / "ddtree-v2"
    commits = {"ddtree-v2": git_checkout(snapshot, repo)}
    if not run_git(repo, "branch", "--list", "next"):
        run_git(repo, "checkout", "-q", "-b", "next")
        readme = repo / "python" / "sglang" / "README.md"
        readme.write_text(readme.read_text() + "\n<!-- ddtree-v2-next: the test hosts' second DDTree commit -->\n")
        run_git(repo, "commit", "-q", "-am", "next commit")
        run_git(repo, "checkout", "-q", "main")
    commits["ddtree-v2-next"] = run_git(repo, "rev-parse", "next")
    for name, commit in commits.items():
        (workdir / "sglang-git" / f"{name}.commit").write_text(commit + "\n")
    return commits


def up(workdir: Path, count: int = 2, prefix: str = "ddt", subnet: str = SUBNET) -> list[TestHost]:
    """Create `count` hosts (ct-test-1 …) at `subnet`.<i>.2, write their keys, known_hosts and subnet under
    workdir, return them. Raises HostsTaken, having changed nothing, if a namespace of that name exists."""
    _require_tools()
    workdir.mkdir(parents=True, exist_ok=True)
    os.chmod(workdir, 0o700)
    _write_keys(workdir)
    sysctl = workdir / "systemctl"
    sysctl.write_text("#!/usr/bin/python3\n" + systemctl_replacement().read_text().split("\n", 1)[1])
    sysctl.chmod(0o755)
    shutil.copy(Path(__file__).with_name("restart_watchdog.py"), workdir / "restart_watchdog.py")
    hosts: list[TestHost] = []
    known = []
    try:
        for i in range(1, count + 1):
            netns, veth = f"{prefix}-host{i}", f"{prefix}v{i}"
            # `ip netns add` is the claim: it fails if the name exists, so two runs cannot both take it.
            if subprocess.run(["ip", "netns", "add", netns], capture_output=True).returncode:
                raise HostsTaken(f"network namespace {netns} already exists: another test run holds it, "
                                 f"or a killed one left it (remove with `make testhost-down`)")
            address = f"{subnet}.{i}.2"
            hosts.append(TestHost(f"ct-test-{i}", i, netns, veth, address, 0, []))  # down() removes it from here on
            _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns])
            _run(["ip", "addr", "add", f"{subnet}.{i}.1/30", "dev", veth])
            _run(["ip", "link", "set", veth, "up"])
            _run(["ip", "netns", "exec", netns, "ip", "addr", "add", f"{address}/30", "dev", "eth0"])
            _run(["ip", "netns", "exec", netns, "ip", "link", "set", "eth0", "up"])
            _write_sshd_config(workdir, i, address)
            with open(workdir / f"host{i}.log", "ab") as log:  # the child keeps its own copy
                proc = subprocess.Popen(
                    ["ip", "netns", "exec", netns, "unshare", "--mount", "--uts", "--propagation", "private",
                     "sh", "-c", _host_script(workdir, i, f"ct-test-{i}")],
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            host = hosts[-1] = TestHost(f"ct-test-{i}", i, netns, veth, address, proc.pid,
                                        ["nsenter", "-t", str(proc.pid), "-n", "-m", "-u"])
            _wait_port(host)
            pub = (workdir / "host_ed25519.pub").read_text().split()[:2]
            known.append(f"[{address}]:{SSH_PORT} {' '.join(pub)}\n")
        (workdir / "known_hosts").write_text("".join(known))
        (workdir / SUBNET_FILE).write_text(subnet + "\n")
        (workdir / STATE_FILE).write_text(json.dumps([asdict(h) for h in hosts], indent=1))
    except BaseException:
        down(workdir, hosts)
        raise
    return hosts


def _subnet_in_use(subnet: str) -> bool:
    return f" {subnet}." in _run(["ip", "-o", "-4", "addr"]).stdout


def up_in_free_slot(workdir: Path, count: int = 2) -> list[TestHost]:
    """`up` in the first slot no other run holds (its own namespace names and subnet), for a test run."""
    for k in SLOTS:
        subnet = f"10.{int(SUBNET.split('.')[1]) + k}"
        if _subnet_in_use(subnet):
            continue
        try:
            return up(workdir, count, prefix=f"ddt{k}", subnet=subnet)
        except HostsTaken:
            continue
    raise RuntimeError(f"all {len(SLOTS)} test-host slots are taken (ddt1-host1 … ddt{SLOTS[-1]}-host1): "
                       f"remove what killed runs left with `make testhost-down`")


def build_standin_wheel(workdir: Path) -> Path:
    """Package tests/endpoint's stand-ins for the test hosts: `sglang_standin` (the server they run) and
    `sglang_standin_gpu_stack` (what the launch-argument check preloads in place of torch and friends)."""
    endpoint = Path(__file__).resolve().parents[1] / "endpoint"
    if not endpoint.is_dir():
        raise RuntimeError(f"no stand-ins at {endpoint}: test hosts are made from a checkout of the repository")
    out = workdir / "wheels"
    wheel = out / "sglang_standin-0.1.0-py3-none-any.whl"
    proj = workdir / "standin-src"
    shutil.rmtree(proj, ignore_errors=True)
    proj.mkdir(parents=True)
    shutil.copy(endpoint / "standin_server.py", proj / "sglang_standin.py")
    shutil.copy(endpoint / "standin_gpu_stack.py", proj / "sglang_standin_gpu_stack.py")
    (proj / "pyproject.toml").write_text(textwrap.dedent("""\
        [build-system]
        requires = ["setuptools>=68"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "sglang-standin"
        version = "0.1.0"
        description = "stand-in SGLang server for the deployment test hosts (tests only)"
        requires-python = ">=3.10"
        [tool.setuptools]
        py-modules = ["sglang_standin", "sglang_standin_gpu_stack"]
    """))
    wheel.unlink(missing_ok=True)
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
          "-w", str(out), str(proj)])
    if not wheel.exists():
        raise RuntimeError(f"building the stand-in wheel did not produce {wheel}")
    return wheel


def load(workdir: Path) -> list[TestHost]:
    path = workdir / STATE_FILE
    return [TestHost(**h) for h in json.loads(path.read_text())] if path.exists() else []


def _namespaces() -> list[str]:
    """Names of this machine's network namespaces (`ip netns list` prints "name (id: N)")."""
    return [line.split()[0] for line in _run(["ip", "netns", "list"]).stdout.splitlines() if line.strip()]


def _remove(netns: str, veth: str, extra_pids: tuple[str, ...] = ()) -> None:
    """Kill the processes inside `netns` (only those), then delete its veth pair and the namespace."""
    pids = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True).stdout.split()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in [*pids, *extra_pids]:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), sig)
        if sig == signal.SIGTERM:
            time.sleep(0.3)
    subprocess.run(["ip", "link", "del", veth], capture_output=True)
    subprocess.run(["ip", "netns", "del", netns], capture_output=True)


def down(workdir: Path, hosts: list[TestHost] | None = None) -> None:
    """Kill every process inside the hosts' namespaces (only those), delete namespaces and links."""
    hosts = load(workdir) if hosts is None else hosts
    for host in hosts:
        _remove(host.netns, host.veth, (str(host.pid),) if host.pid else ())
    (workdir / STATE_FILE).unlink(missing_ok=True)


def remove_leftovers(prefix: str = "ddt") -> list[str]:
    """Remove the hosts a killed run left behind (its state file is gone with its temporary directory):
    every namespace named like `up`'s (`{prefix}[<k>]-host<i>`), its processes and its veth. Returns their names."""
    left = []
    for netns in _namespaces():
        m = re.fullmatch(rf"({re.escape(prefix)}\d*)-host(\d+)", netns)
        if m:
            _remove(netns, f"{m.group(1)}v{m.group(2)}")
            left.append(netns)
    return left


def on_host(host: TestHost, command: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run a shell command inside the host's namespaces (what the host itself would see)."""
    return subprocess.run([*host.exec_prefix, "sh", "-c", command], capture_output=True, text=True, check=check)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("action", choices=["up", "down"])
    ap.add_argument("--dir", default=".cache/testhosts", help="keys, known_hosts and state (default .cache/testhosts)")
    ap.add_argument("--count", type=int, default=1)


def run(args: argparse.Namespace) -> int:
    """`python -m tests.support.testhost up|down`."""
    workdir = Path(args.dir).resolve()
    if args.action == "down":
        down(workdir)
        left = remove_leftovers()
        killed = f"; left behind by a killed run: {', '.join(left)}" if left else ""
        print(f"test hosts in {workdir} removed{killed}")
        return 0
    if load(workdir):
        down(workdir)
    build_standin_wheel(workdir)
    make_git_sources(workdir)
    for h in up(workdir, args.count):
        print(f"{h.name}: root@{h.address} port {SSH_PORT} (netns {h.netns}), key {workdir}/id_ed25519")
    return 0



def main(argv: list[str] | None = None) -> int:
    """`python -m tests.support.testhost up|down` (as root): what `make testhost` and `make testhost-down` run."""
    ap = argparse.ArgumentParser(prog="python -m tests.support.testhost", description=__doc__.splitlines()[0])
    add_arguments(ap)
    args = ap.parse_args(argv)
    try:
        return run(args)
    except RuntimeError as exc:
        print(f"testhost {args.action}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
