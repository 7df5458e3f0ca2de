"""The patch tool on real SGLang release sources: all or nothing, idempotent, exactly reversible."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ddtree_ops import patchtool
from ddtree_ops.cli import main as cli
from ddtree_ops.series import DEFAULT_PATCHES, load_series
from ddtree_ops.sglang_tree import TargetError

from .conftest import RELEASES, tree_hashes

PATCHED_FILES = {"sglang/srt/speculative/dflash_utils.py", "sglang/srt/layers/attention/attention_registry.py"}


@pytest.mark.parametrize("version", RELEASES)
def test_apply_twice_then_revert_is_byte_identical(pristine, version):
    target = pristine(version)
    before = tree_hashes(target)

    first = patchtool.apply(target)
    assert first.outcome == "applied" and first.sglang_version == version
    after = tree_hashes(target)
    changed = {f for f in before if before[f] != after.get(f)}
    assert changed == PATCHED_FILES
    record = json.loads((target / "sglang" / patchtool.RECORD).read_text())
    series = next(s for s in load_series() if s.name == first.series)
    assert [p["name"] for p in record["patches"]] == [p.name for p in series.patches]
    assert [p["sha256"] for p in record["patches"]] == [p.sha256() for p in series.patches]

    second = patchtool.apply(target)
    assert second.outcome == "already applied"
    assert tree_hashes(target) == after
    assert patchtool.status(target).outcome == patchtool.APPLIED

    assert patchtool.revert(target).outcome == "reverted"
    assert tree_hashes(target) == before  # every file byte-identical, the record gone
    assert patchtool.revert(target).outcome == "not applied"


@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_git_checkout_layout(pristine, tmp_path, version):
    """A checkout keeps sources under python/sglang/: the same patches apply there."""
    src = pristine(version)
    repo = tmp_path / "checkout"
    (repo / "python").mkdir(parents=True)
    shutil.move(str(src / "sglang"), repo / "python" / "sglang")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "release"], check=True)

    report = patchtool.apply(repo)
    assert report.outcome == "applied" and report.layout == "git checkout"
    changed = subprocess.run([*git, "diff", "--name-only"], capture_output=True, text=True, check=True).stdout
    assert set(changed.split()) == {f"python/{f}" for f in PATCHED_FILES}

    patchtool.revert(repo)
    status = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True, check=True).stdout
    assert status == ""


def _broken_series(tmp_path: Path) -> Path:
    """The shipped series with patch 0002's context no longer matching any release."""
    copy = tmp_path / "patches"
    shutil.copytree(DEFAULT_PATCHES, copy)
    p = next((copy / "sglang-0.5.14+").glob("0002-*.patch"))
    text = p.read_text()
    p.write_text(text.replace(" from sglang.srt.layers.attention.triton_backend import TritonAttnBackend",
                              " from sglang.srt.layers.attention.triton_backend import TritonAttnBackendV2"))
    return copy


def test_broken_patch_leaves_target_untouched_and_names_the_hunk(pristine, tmp_path):
    target = pristine("0.5.23")
    before = tree_hashes(target)
    with pytest.raises(patchtool.PatchError) as info:
        patchtool.apply(target, patches=_broken_series(tmp_path))
    assert tree_hashes(target) == before  # 0001 would apply on its own: it was not applied either
    (failure,) = info.value.failures
    assert failure.patch.startswith("0002-")
    assert failure.file == "sglang/srt/layers/attention/attention_registry.py"
    assert failure.hunk.startswith("#1 @@ -")
    assert "context" in failure.reason
    assert "0002-" in str(info.value) and "attention_registry.py" in str(info.value)


def test_cli_exit_codes_and_json(pristine, tmp_path):
    target = pristine("0.5.23")
    cli = [sys.executable, "-m", "ddtree_ops", "patch"]
    ok = subprocess.run([*cli, "apply", str(target), "--json"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["outcome"] == "applied"
    subprocess.run([*cli, "revert", str(target)], check=True, capture_output=True)
    bad = subprocess.run([*cli, "apply", str(target), "--patches", str(_broken_series(tmp_path))],
                         capture_output=True, text=True)
    assert bad.returncode == 1
    assert "FAILED" in bad.stderr and "0002-" in bad.stderr and "hunk #1" in bad.stderr
    nowhere = subprocess.run([*cli, "check", str(tmp_path / "empty-dir-that-is-missing")], capture_output=True,
                             text=True)
    assert nowhere.returncode == 2 and "not a directory" in nowhere.stderr


def test_partially_patched_tree_is_refused_and_revert_takes_it_back(pristine):
    target = pristine("0.5.22")
    pristine_hashes = tree_hashes(target)
    first = next(s for s in load_series() if s.name == "sglang-0.5.14+").patches[0]
    subprocess.run(["git", "apply", str(first.path)], cwd=target, check=True)
    before = tree_hashes(target)
    with pytest.raises(patchtool.PatchError) as info:
        patchtool.apply(target)
    message = str(info.value)
    assert "partially patched" in message and "sglang/srt/speculative/dflash_utils.py" in message
    assert f"ddtree-ops patch revert {target}" in message  # the command that fixes it ...
    assert tree_hashes(target) == before
    assert patchtool.revert(target).outcome == "reverted"  # ... does
    assert tree_hashes(target) == pristine_hashes
    assert patchtool.apply(target).outcome == "applied"


def test_a_file_edited_after_the_patches_is_named_and_status_fails(pristine, capsys):
    target = pristine("0.5.23")
    patchtool.apply(target)
    registry = target / "sglang/srt/layers/attention/attention_registry.py"
    registry.write_text(registry.read_text().replace("return make_triton_backend(TritonAttnBackend, runner)",
                                                     "return make_triton_backend(TritonAttnBackend, runner)  # local"))
    report = patchtool.status(target)
    assert report.outcome == patchtool.MODIFIED
    assert report.patches["0002-triton-route-target-verify-to-ddtree-kernels.patch"] == patchtool.MODIFIED
    for action in (patchtool.apply, patchtool.revert):
        with pytest.raises(patchtool.PatchError) as info:
            action(target)
        message = str(info.value)
        assert "changed since the patches were applied" in message and "attention_registry.py" in message
        assert "pip install --force-reinstall --no-deps sglang==0.5.23" in message
    assert cli(["patch", "status", str(target)]) == 1
    assert "modified since applied" in capsys.readouterr().err


def test_release_outside_every_series(pristine):
    target = pristine("0.5.23")
    with pytest.raises(LookupError, match=r"0\.5\.10 matches no patch series.*--series"):
        patchtool.check(target, sglang_version="0.5.10")
    with pytest.raises(LookupError, match=r"0\.5\.99"):
        patchtool.check(target, sglang_version="0.5.99")
    # An operator (or the release job) can still try the newest series on a newer release.
    assert patchtool.check(target, sglang_version="0.5.99", series="sglang-0.5.14+").outcome == "would apply"


def test_not_an_sglang_tree(tmp_path):
    with pytest.raises(TargetError, match="no SGLang package"):
        patchtool.status(tmp_path)
