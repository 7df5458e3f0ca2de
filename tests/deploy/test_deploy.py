"""The real playbooks, run with ansible-playbook over SSH against two local test hosts.

The cases run in file order and build on each other (one deploy history per host, as on a
real server); each checks the state on the host itself: the `current` link, the release
markers, the unit, the process and which SGLang version answers on the port. They share one
file because `make test` distributes whole files (--dist loadfile): one worker owns the hosts.
What they install is a DDTree branch built from git, as production does: the shared ddtree-v2
snapshot made a git repository (OLD) with one later commit (NEW), reached by file:// URL. One
case installs a PyPI release, which the launch-argument check refuses.
What a deploy checks before the switch (self-check, DSA, venv record) and the Fabric tasks are in
test_deploy_checks_and_fab.py, with test hosts of their own, so that the two files run side by side.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests

from ddtree_ops import hosts as remote
from ddtree_ops.series import load_series

from .conftest import H1, H2, NEW, OLD, REPO, ROOT, UNIT, Hosts, deployed

DDTREE_V2_PATCHES = [p.name for p in next(s for s in load_series() if s.name == "ddtree-v2").patches]


def test_first_deploy_on_two_hosts(hosts: Hosts):
    result = hosts.play("deploy.yml", extra={**hosts.source(OLD), "ddtree_selfcheck": True})
    assert result.rc == 0, result.output[-4000:]
    for host in (H1, H2):
        assert result.recap[host]["failed"] == 0
        st = deployed(hosts, host, OLD)
        info = st["info"]
        # the real SGLang wheel in the release venv was patched by the patch tool, the whole ddtree-v2 series
        assert [p["name"] for p in info["ddtree_patches"]["patches"]] == DDTREE_V2_PATCHES
        assert info["ddtree_patches"]["sglang_version"] == hosts.version(OLD)
        assert info["ddtree_patches"]["series"] == "ddtree-v2"  # found by its sources, no version flag
        args = " ".join(info["server_args"])
        assert "--speculative-algorithm DDTREE" in args and "--page-size 1" in args
        assert "--attention-backend triton" in args and info["verify_kernel"] == "ddtree"
        # the unit refers only to current/ and is valid for systemd
        unit = hosts.sh(host, f"cat {UNIT}")
        assert f"EnvironmentFile={ROOT}/current/sglang.env" in unit
        assert f"ExecStart={ROOT}/current/venv/bin/ddtree-ops serve {ROOT}/current/launch.json" in unit
        assert "/releases/" not in unit and "KillMode=mixed" in unit and "User=sglang" in unit
        verify = hosts.sh(host, f"cp {UNIT} /tmp/ddtree-verify.service && "
                                f"systemd-analyze verify --man=no /tmp/ddtree-verify.service 2>&1; echo rc=$?")
        assert verify == "rc=0", f"systemd-analyze verify printed: {verify}"
        # secrets file 0600 root; server runs as the dedicated user, which exists only on the host
        assert hosts.sh(host, f"stat -c '%a %U' {ROOT}/current/sglang.env") == "600 root"
        assert hosts.sh(host, f"ps -o user= -p {st['pids'][0]}") == "sglang"
        assert hosts.sh(host, f"readlink {ROOT}/current") == f"releases/{st['current']}"  # relative link
        # the kernel ran against the float64 reference on the host before the switch (here: the interpreter)
        check = json.loads(hosts.sh(host, f"cat {ROOT}/current/selfcheck.json"))
        assert check["ok"] and check["device"] == "CPU, Triton interpreter" and len(check["cases"]) == 3
    with pytest.raises(KeyError):
        pwd.getpwnam("sglang")  # nothing reached this machine's /etc


def test_second_deploy_changes_nothing(hosts: Hosts):
    """On one host: the role runs the same on each, and the first deploy covered both."""
    before = hosts.state(H2)
    result = hosts.play("deploy.yml", limit=H2, extra=hosts.source(OLD))
    assert result.rc == 0, result.output[-4000:]
    assert result.changed(H2) == 0, result.output[-4000:]
    after = hosts.state(H2)
    assert after["pids"] == before["pids"], "the server was restarted"
    assert after["current"] == before["current"] and after["releases"] == before["releases"]


def test_smoke_playbook_runs_the_release_smoke_test_on_the_host(hosts: Hosts):
    result = hosts.play("smoke.yml", limit=H1)  # make smoke-test HOST=ct-test-1
    assert result.rc == 0, result.output[-3000:]
    text = " ".join(result.output.split())  # the debug output wraps long lines
    assert "PASS speculative acceptance length >= 1.5" in text
    assert "PASS TARGET_VERIFY served by ddtree_kernels" in text
    assert "all checks passed, acceptance length 4.00" in text


def test_check_mode_reports_and_touches_nothing(hosts: Hosts):
    before = hosts.state(H1)
    listing = hosts.sh(H1, f"find {ROOT} /etc/systemd/system -printf '%p %s %T@\\n' | sort")
    result = hosts.play("deploy.yml", "--check", "--diff", limit=H1, extra=hosts.source(NEW))
    assert result.rc == 0, result.output[-4000:]
    assert result.changed(H1) > 0  # it says what would change ...
    assert "Switch current to" in result.output
    text = " ".join(result.output.split())
    assert f"{H1}: would deploy release" in text and " serves http" not in text  # ... not that it serves
    after = hosts.state(H1)  # ... and changed none of it
    assert hosts.sh(H1, f"find {ROOT} /etc/systemd/system -printf '%p %s %T@\\n' | sort") == listing
    assert after["pids"] == before["pids"] and after["info"]["version"] == hosts.version(OLD)


def _serving_budget(hosts: Hosts, host: str) -> str:
    args = hosts.state(host)["info"]["server_args"]
    return args[args.index("--speculative-ddtree-budget") + 1]


def test_upgrade_to_a_new_pin_with_settings_given_as_strings(hosts: Hosts):
    """An upgrade as an operator types it: `-e name=value` gives strings, and every numeric and boolean setting is
    read through a filter."""
    old = hosts.state(H1)["current"]
    result = hosts.play("deploy.yml", "-e", "ddtree_releases_keep=3", "-e", "ddtree_health_timeout_s=20",
                        "-e", "ddtree_min_free_disk_gb=1", "-e", "ddtree_smoke_min_accept_length=1.5",
                        "-e", "ddtree_smoke=true", "-e", "ddtree_smoke_verify_stats=false",
                        "-e", "ddtree_budget=10", limit=H1, extra=hosts.source(NEW))
    assert result.rc == 0, result.output[-4000:]
    st = deployed(hosts, H1, NEW)
    assert _serving_budget(hosts, H1) == "10"
    assert st["current"] != old and st["releases"][old] == {"complete": True, "verified": True}
    assert len(st["venvs"]) == 2
    assert f"roll back: make rollback HOST={H1} INVENTORY=inventory/test" in result.output
    assert hosts.state(H2)["info"]["version"] == hosts.version(OLD)  # --limit kept the other host out


def test_patch_that_does_not_apply_switches_nothing(hosts: Hosts, tmp_path):
    before = hosts.state(H1)
    broken = tmp_path / "patches"
    shutil.copytree(REPO / "patches", broken)
    patch = next(broken.rglob("0002-*.patch"))
    text = patch.read_text()
    hunk = text.index("\n@@ ")  # a context line of the first hunk (not the diffstat above it)
    first_context = next(line for line in text[hunk:].splitlines()[2:] if line.startswith(" ") and line.strip())
    patch.write_text(text[:hunk] + text[hunk:].replace(first_context, first_context + "  # not in SGLang", 1))
    result = hosts.play("deploy.yml", limit=H1, extra={**hosts.source(NEW), "ddtree_patches_dir": str(broken)})
    assert result.rc != 0
    assert "Apply the patch set" in result.output and "0002-" in result.output
    assert "nothing was switched" in result.output
    after = hosts.state(H1)
    assert after["current"] == before["current"] and after["pids"] == before["pids"]
    assert after["releases"] == before["releases"] and sorted(after["venvs"]) == sorted(before["venvs"])
    assert after["info"]["version"] == hosts.version(NEW) and after["health"] == 200


def _refused_before_switch(hosts: Hosts, extra: dict) -> str:
    before = hosts.state(H1)
    result = hosts.play("deploy.yml", limit=H1, extra=extra)
    assert result.rc != 0
    text = " ".join(result.output.split())
    assert "parse the unit's server arguments" in text and "Nothing was switched" in text, result.output[-3000:]
    after = hosts.state(H1)
    assert after["current"] == before["current"] and after["pids"] == before["pids"]
    assert after["releases"] == before["releases"] and after["health"] == 200
    return text


def test_release_without_ddtree_is_refused_by_its_own_sglang(hosts: Hosts):
    """The PyPI case: 0.5.23 installs and patches, then its own parser refuses DDTree's flags."""
    text = _refused_before_switch(hosts, {"ddtree_sglang_version": "0.5.23", "ddtree_sglang_git_url": "",
                                          "ddtree_sglang_git_commit": ""})
    assert "SGLang 0.5.23 refuses the arguments: unrecognized arguments: --speculative-ddtree-budget" in text


def test_flag_the_ddtree_build_does_not_know_is_refused(hosts: Hosts):
    text = _refused_before_switch(hosts, {**hosts.source(NEW), "ddtree_server_args_extra": ["--no-such-flag", "1"]})
    assert f"SGLang {hosts.version(NEW)} refuses the arguments: unrecognized arguments: --no-such-flag 1" in text


def test_health_never_ready_rolls_back(hosts: Hosts):
    before = hosts.state(H1)
    result = hosts.play("deploy.yml", limit=H1, extra={
        **hosts.source(NEW), "ddtree_health_timeout_s": 4,
        "ddtree_env": {"STANDIN_WARMUP_S": "1", "STANDIN_NEVER_HEALTHY": "1"}})
    assert result.rc != 0
    assert "Wait for /health_generate" in result.output
    text = " ".join(result.output.split())
    assert f"rolled back: release {before['current']} is current and healthy" in text
    assert "fab logs --host ct-test-1" in text  # where the cause is
    after = hosts.state(H1)
    assert after["current"] == before["current"] and after["health"] == 200
    assert after["info"]["version"] == hosts.version(NEW)
    failed = [r for r, m in after["releases"].items() if m.get("failed")]
    assert len(failed) == 1 and failed[0] not in before["releases"]
    assert "verified" not in after["releases"][failed[0]]


def test_smoke_failure_rolls_back(hosts: Hosts):
    before = hosts.state(H1)
    result = hosts.play("deploy.yml", limit=H1, extra={
        **hosts.source(NEW), "ddtree_env": {"STANDIN_WARMUP_S": "1", "STANDIN_ACCEPT_LENGTH": "1"}})
    assert result.rc != 0
    assert "Smoke-test the endpoint" in result.output and "accept" in result.output
    after = hosts.state(H1)
    assert after["current"] == before["current"] and after["info"]["version"] == hosts.version(NEW)
    assert after["pids"] != before["pids"], "the previous release was restarted"
    assert sum(1 for m in after["releases"].values() if m.get("failed")) == 2


def test_rollback_picks_the_newest_verified_release_and_skips_failed(hosts: Hosts):
    st = hosts.state(H1)
    new_release = st["current"]
    verified = [r for r, m in st["releases"].items() if m.get("verified") and r != new_release]
    assert len(verified) == 1  # the OLD release; the two failed ones are newer but must be skipped
    result = hosts.play("rollback.yml", limit=H1)
    assert result.rc == 0, result.output[-4000:]
    back = deployed(hosts, H1, OLD)
    assert back["current"] == verified[0] and back["pids"] != st["pids"]

    # by id, back to the new release; an unknown id is refused and changes nothing
    result = hosts.play("rollback.yml", limit=H1, extra={"rollback_to": new_release})
    assert result.rc == 0, result.output[-4000:]
    assert deployed(hosts, H1, NEW)["current"] == new_release
    result = hosts.play("rollback.yml", limit=H1, extra={"rollback_to": "no-such-release"})
    assert result.rc != 0 and "does not exist" in result.output and new_release in result.output
    assert hosts.state(H1)["current"] == new_release


def test_rolling_deploy_stops_at_the_first_failing_host(hosts: Hosts):
    before = {h: hosts.state(h) for h in (H1, H2)}
    result = hosts.play("deploy.yml", extra={
        **hosts.source(NEW), "ddtree_health_timeout_s": 3,
        "ddtree_env": {"STANDIN_WARMUP_S": "1", "STANDIN_NEVER_HEALTHY": "1", "ROLL": "1"}})
    assert result.rc != 0
    assert result.recap[H1]["failed"] == 1
    assert H2 not in result.recap or result.recap[H2]["ok"] == 0, result.recap
    h2 = hosts.state(H2)
    assert h2 == {**before[H2], "health": 200}  # untouched: same release, process, version
    assert hosts.state(H1)["current"] == before[H1]["current"]


def test_pruning_keeps_current_and_previous_verified(hosts: Hosts):
    st = hosts.state(H2)
    r1 = st["current"]  # the OLD release, verified
    keep = {**hosts.source(NEW), "ddtree_releases_keep": 2}
    assert hosts.play("deploy.yml", limit=H2, extra={**keep, "ddtree_budget": 32}).rc == 0
    r2 = hosts.state(H2)["current"]
    # the server answers, but every TARGET_VERIFY fell back to SGLang's slow path: not verified
    failing = hosts.play("deploy.yml", limit=H2, extra={
        **keep, "ddtree_budget": 16, "ddtree_env": {"STANDIN_VERIFY": "declined:sliding-window attention"}})
    assert failing.rc != 0
    assert "never reached ddtree_kernels" in failing.output and "sliding-window attention" in failing.output
    st = hosts.state(H2)
    r3 = next(r for r, m in st["releases"].items() if m.get("failed"))
    assert set(st["releases"]) == {r1, r2, r3}  # a failed deploy prunes nothing
    sequence = {r: json.loads(hosts.sh(H2, f"cat {ROOT}/releases/{r}/manifest.json"))["sequence"] for r in (r1, r2, r3)}
    assert sequence[r1] < sequence[r2] < sequence[r3], sequence  # the install order, recorded in the manifest
    # Releases are ordered by that sequence, not by file times: r1's markers made the newest changes nothing.
    hosts.sh(H2, f"touch -d '+1 hour' {ROOT}/releases/{r1}/.verified {ROOT}/releases/{r1}/.complete")
    # a bundle copy no release uses (what an install that failed after its copy leaves): pruned as an orphan
    hosts.sh(H2, f"touch {ROOT}/shared/bundles/0123456789ab.tar")
    # this deploy also takes the API key from the operator's environment, as production does
    key = "test-key-0123456789"
    result = hosts.play("deploy.yml", limit=H2, extra={**keep, "ddtree_budget": 8}, env={"DDTREE_API_KEY": key})
    assert result.rc == 0, result.output[-4000:]
    assert key not in result.output  # no_log on the env file, the smoke test gets it from the environment
    hosts.api_key[H2] = key
    st = hosts.state(H2)
    r4 = st["current"]
    # 4 releases, keep 2: the failed one goes first, then the oldest verified; r2 stays as the previous verified
    assert set(st["releases"]) == {r2, r4}, (r1, r2, r3, r4, st["releases"])
    assert json.loads(hosts.sh(H2, f"cat {ROOT}/releases/{r4}/manifest.json"))["sequence"] > sequence[r3]
    assert st["venvs"] == [r4.split("-")[0]]  # r1's venv (the OLD bundle) went with it
    assert hosts.sh(H2, f"ls {ROOT}/shared/bundles") == f"{r4.split('-')[0]}.tar"
    assert "--speculative-ddtree-budget 8" in " ".join(st["info"]["server_args"])
    assert hosts.sh(H2, f"grep -c {key} {ROOT}/current/sglang.env") == "1"
    assert requests.get(f"http://{hosts[H2].address}:30000/server_info", timeout=5).status_code == 401


# -- interrupted, concurrent and repeated deploys (issue 35) ------------------------------

def _deploy_held_after_switch(hosts: Hosts, hold: Path, budget: int) -> tuple[subprocess.Popen, list[str]]:
    """`make deploy` (ddtree-ops play) of NEW on H1 with budget `budget`, returned once it waits at the hold right
    after the switch (the hold file exists until the caller removes it): an event, not a moment, to act on."""
    hold.touch()
    run = hosts.start("deploy.yml", "-e", f"ddtree_budget={budget}", "-e", f"ddtree_hold_after_switch={hold}",
                      limit=H1, extra=hosts.source(NEW), wrapped=True)
    seen = []
    for line in run.stdout:
        seen.append(line)
        if "TASK [ddtree : Hold after the switch" in line:
            return run, seen
    hold.unlink(missing_ok=True)
    run.wait(timeout=60)
    raise AssertionError("the deploy ended before its hold after the switch:\n" + "".join(seen[-40:]))


def test_an_interrupted_deploy_converges_on_its_rerun(hosts: Hosts, test_inventory, tmp_path):
    """`ddtree-ops play` (make deploy) killed with kill -9 right after the switch: its playbook dies with it, so
    nothing goes on unseen; `current` names the new release while the old process serves, and the lock is left,
    naming the playbook's own process. The rerun is refused naming the lock's holder as gone; with the lock broken
    it restarts the server (the process is not the current release), verifies and marks the release verified.
    The deploy waits after the switch while a hold file exists, so the kill lands there however late this test
    reads the output."""
    before = hosts.state(H1)
    hold = tmp_path / "hold-after-switch"
    run, seen = _deploy_held_after_switch(hosts, hold, 12)
    try:
        owner = json.loads(hosts.sh(H1, f"cat {ROOT}/.deploy-lock/owner.json"))
        play_pid = int(owner["pid"])
        assert "ansible-playbook" in Path(f"/proc/{play_pid}/cmdline").read_text().replace("\0", " ")
        os.kill(run.pid, signal.SIGKILL)  # the wrapper alone: no handler of its runs
        run.wait(timeout=60)
        deadline = time.monotonic() + 120
        while "\nState:\tZ" not in _status(play_pid):
            assert time.monotonic() < deadline, "ansible-playbook outlived the wrapper that ran it"
            time.sleep(0.2)
    finally:
        hold.unlink(missing_ok=True)
    mid = hosts.state(H1)
    assert mid["current"] != before["current"] and mid["serving"] == before["current"], "".join(seen[-20:])
    assert mid["lock"] and _serving_budget(hosts, H1) == "10"
    conn, hv = remote.connect(H1, "inventory/test")  # fab status: not in order while current never passed
    report, ok = remote.status_report(conn, hv)
    assert not ok and f"current names {mid['current']}, which never passed" in report, report

    refused = hosts.play("deploy.yml", "-e", "ddtree_budget=12", limit=H1, extra=hosts.source(NEW))
    text = " ".join(refused.output.split())
    assert refused.rc != 0 and "holds ct-test-1's lock" in text and "ddtree_break_lock=true" in text
    assert "That run is gone" in text and "stale" in text  # its ansible-playbook no longer runs here
    assert hosts.state(H1)["pids"] == mid["pids"]  # nothing was touched

    # The old server dies while `current` names the release that never passed: the unit's Restart= runs
    # `ddtree-ops serve`, which refuses it (the killed run left no lease) and names the one to roll back to.
    hosts.sh(H1, f"kill -9 {mid['pids'][0]}")
    refusal = f"not starting release {mid['current']}"
    deadline = time.monotonic() + 120
    while refusal not in (log := hosts.sh(H1, "cat /var/log/journal/sglang-ddtree.service.log 2>/dev/null || true")):
        assert time.monotonic() < deadline, log[-3000:]
        time.sleep(0.5)
    assert f"roll back to verified release {before['current']}" in " ".join(log.split())
    assert not hosts.state(H1)["pids"]  # nothing serves rather than the unverified release
    result = hosts.play("deploy.yml", "-e", "ddtree_budget=12", "-e", "ddtree_break_lock=true", limit=H1,
                        extra=hosts.source(NEW))
    assert result.rc == 0, result.output[-4000:]
    text = " ".join(result.output.split())
    # before anything else, the verified release that was serving went back into `current`
    assert f"an earlier run stopped before release {mid['current']} passed" in text
    assert f"current is back on verified release {before['current']}, healthy" in text
    st = deployed(hosts, H1, NEW)
    assert st["current"] == mid["current"] and _serving_budget(hosts, H1) == "12"


def _status(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return "\nState:\tZ"  # gone


def test_ctrl_c_after_the_switch_puts_back_the_verified_release(hosts: Hosts, tmp_path):
    """`make deploy` (ddtree-ops play) interrupted as a terminal's Ctrl-C would (SIGINT to the whole process group)
    between the switch and the restart: it resumes, so `current` names the verified release that still serves
    and the lock is released. The deploy waits after the switch while a hold file exists, so the signal lands
    there however late this test reads the task's header (a loaded machine once let the play run on to verified)."""
    before = hosts.state(H1)
    hold = tmp_path / "hold-after-switch"
    run, seen = _deploy_held_after_switch(hosts, hold, 13)
    try:
        held = hosts.state(H1)  # the play cannot pass the hold: current is switched, the old process serves
        assert held["current"] != before["current"] and held["serving"] == before["current"], "".join(seen[-20:])
        os.killpg(run.pid, signal.SIGINT)
        out = "".join(seen) + run.communicate(timeout=300)[0]
    finally:
        hold.unlink(missing_ok=True)
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode == 130, out[-3000:]
    assert "stopped (SIGINT): running playbooks/resume.yml" in out
    text = " ".join(out.split())
    assert f"current is back on verified release {before['current']}" in text, out[-3000:]
    after = deployed(hosts, H1, NEW)  # current verified, serving, no lock left
    assert after["current"] == before["current"] and after["pids"] == before["pids"]
    interrupted = [r for r, m in after["releases"].items() if m == {"complete": True}]
    assert len(interrupted) == 1  # the new release stays, complete and never verified, not current


def test_one_deploy_at_a_time(hosts: Hosts):
    first = hosts.start("deploy.yml", "-e", "ddtree_budget=14", limit=H1, extra=hosts.source(NEW))
    deadline = time.monotonic() + 120
    while not hosts.sh(H1, f"cat {ROOT}/.deploy-lock/owner.json 2>/dev/null || true"):
        assert time.monotonic() < deadline and first.poll() is None, "the first deploy never took the lock"
        time.sleep(0.5)
    second = hosts.play("deploy.yml", "-e", "ddtree_budget=16", limit=H1, extra=hosts.source(NEW))
    out, _ = first.communicate(timeout=900)
    assert first.returncode == 0, out[-4000:]
    text = " ".join(second.output.split())
    assert second.rc != 0 and "holds ct-test-1's lock" in text and " since " in text
    assert "That run is live (process" in text and "wait for it to finish" in text
    deployed(hosts, H1, NEW)
    assert _serving_budget(hosts, H1) == "14"  # only the first one served


def test_a_verified_release_failing_again_is_not_marked_failed(hosts: Hosts):
    """The current, verified release fails this run's smoke test (its server was down, so the rerun restarts
    and smoke-tests it, against a floor it cannot meet): it stays current and is not marked failed; the next
    run converges without a restart."""
    before = hosts.state(H1)
    hosts.sh(H1, "systemctl stop sglang-ddtree")
    result = hosts.play("deploy.yml", "-e", "ddtree_budget=14", "-e", "ddtree_smoke_min_accept_length=9",
                        limit=H1, extra=hosts.source(NEW))
    text = " ".join(result.output.split())
    assert result.rc != 0 and "had served and passed before, so it was not marked failed" in text, text[-3000:]
    after = hosts.state(H1)
    assert after["current"] == before["current"] and "failed" not in after["releases"][before["current"]]
    again = hosts.play("deploy.yml", "-e", "ddtree_budget=14", limit=H1, extra=hosts.source(NEW))
    assert again.rc == 0, again.output[-4000:]
    restart = again.output.split("TASK [ddtree : Restart the server on release", 1)[1].split("TASK [", 1)[0]
    assert "skipping" in restart  # the failed run had started this release; nothing to restart
    deployed(hosts, H1, NEW)


def test_a_failing_redeploy_of_an_older_release_restores_the_one_serving(hosts: Hosts):
    """Budget 12 was verified earlier, budget 14 serves: redeploying 12 against a smoke floor it cannot meet fails,
    12 is not marked failed (it served and passed before), and 14 is current and serving again."""
    before = deployed(hosts, H1, NEW)
    assert _serving_budget(hosts, H1) == "14"
    result = hosts.play("deploy.yml", "-e", "ddtree_budget=12", "-e", "ddtree_smoke_min_accept_length=9",
                        limit=H1, extra=hosts.source(NEW))
    text = " ".join(result.output.split())
    assert result.rc != 0 and "had served and passed before, so it was not marked failed" in text, text[-3000:]
    back = f"rolled back: release {before['current']} is current and healthy (it was serving before this deploy)"
    assert back in text
    after = deployed(hosts, H1, NEW)
    assert after["current"] == before["current"] and _serving_budget(hosts, H1) == "14"
    assert not any(m.get("failed") for m in after["releases"].values()), after["releases"]


def test_a_killed_server_is_restarted_by_its_unit(hosts: Hosts):
    before = hosts.state(H1)
    hosts.sh(H1, f"kill -9 {before['pids'][0]}")
    deadline = time.monotonic() + 30
    while True:
        st = hosts.state(H1)
        if st["health"] == 200 and st["pids"] and st["pids"] != before["pids"]:
            break
        assert time.monotonic() < deadline, f"not restarted (Restart=on-failure, RestartSec=2): {st}"
        time.sleep(1)
    assert st["serving"] == before["current"]
    assert "restarting sglang-ddtree.service" in hosts.sh(H1, "cat /var/log/restart-watchdog.log")


def test_rollback_to_a_failed_release_needs_force_and_the_printed_hint_runs(hosts: Hosts):
    good = hosts.state(H1)["current"]
    low_acceptance = {"STANDIN_WARMUP_S": "1", "STANDIN_ACCEPT_LENGTH": "1"}
    smoke_fails = hosts.play("deploy.yml", limit=H1,
                             extra={**hosts.source(NEW), "ddtree_budget": 4, "ddtree_env": low_acceptance})
    assert smoke_fails.rc != 0 and f"rolled back: release {good} is current and healthy" in " ".join(
        smoke_fails.output.split())
    st = hosts.state(H1)
    assert st["current"] == st["serving"] == good
    failed = next(r for r, m in st["releases"].items() if m.get("failed") and m.get("complete"))
    refused = hosts.play("rollback.yml", limit=H1, extra={"rollback_to": failed})
    assert refused.rc != 0 and "rollback_force=true" in refused.output
    assert hosts.state(H1)["current"] == good
    # forced, it starts, but fails the smoke test as it did before: back to the release that was serving
    forced = hosts.play("rollback.yml", limit=H1, extra={"rollback_to": failed, "rollback_force": True})
    text = " ".join(forced.output.split())
    assert forced.rc != 0 and f"Rollback of {H1} to release {failed} failed" in text and "Smoke-test" in text
    assert f"current is back on release {good}, which was serving before and is healthy again" in text
    st = deployed(hosts, H1, NEW)
    assert st["current"] == good and "verified" not in st["releases"][failed]
    # the deploy prints how to roll back; run it exactly as printed, from the repository root: to the release
    # that is current and serving, it changes nothing (no restart)
    hint = f"make rollback HOST={H1} INVENTORY=inventory/test ARGS='-e rollback_to={good}'"
    proc = subprocess.run(hint, shell=True, cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "DDTREE_TESTHOST_DIR": str(hosts.workdir)})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert f"release {good} is current and its server process is running; nothing was changed" in " ".join(
        proc.stdout.split())
    assert hosts.state(H1)["pids"] == st["pids"]


def test_a_rollback_to_a_broken_release_returns_to_the_one_serving(hosts: Hosts):
    """A verified release whose launch file was damaged on the host cannot start: the rollback to it ends with the
    release that was serving current, serving and healthy, and the message names both."""
    before = deployed(hosts, H1, NEW)
    broken = next(r for r, m in before["releases"].items() if m.get("verified") and r != before["current"])
    hosts.sh(H1, f"echo '{{broken' > {ROOT}/releases/{broken}/launch.json")
    result = hosts.play("rollback.yml", limit=H1, extra={"rollback_to": broken})
    text = " ".join(result.output.split())
    assert result.rc != 0 and f"Rollback of {H1} to release {broken} failed" in text, text[-3000:]
    assert f"current is back on release {before['current']}, which was serving before and is healthy again" in text
    after = deployed(hosts, H1, NEW)
    assert after["current"] == before["current"]
    hosts.sh(H1, f"rm -rf {ROOT}/releases/{broken}")  # not a release to keep around
