"""The patch tool and the release job on DDTree branches: the shared snapshots as git checkouts."""

from __future__ import annotations

import pytest

from ddtree_ops import patchtool
from ddtree_ops.cli import main as cli
from ddtree_ops.ddtree_sources import git_checkout, load_sources
from ddtree_ops.release_job import check_ddtree_source, run_release_job
from ddtree_ops.sglang_tree import locate

from .conftest import tree_hashes

SNAPSHOTS = [s for s in load_sources() if s.snapshot]
PATCHED = {"python/sglang/srt/speculative/dflash_utils.py", "python/sglang/srt/layers/attention/attention_registry.py"}
# What each branch gets, found from its sources: ddtree-v2 also takes 0003 (its accept path),
# 0004 (our backend fed the compact tree visibility), 0005 (no host sync in its verify step), 0006
# (the MLA pool's move in one launch) and 0007 (a DSA model at page size 1, its indexer's queries to our backend).
EXPECTED = {
    "ddtree-v2": ("ddtree-v2", PATCHED | {"python/sglang/srt/speculative/ddtree_worker_v2.py",
                                          "python/sglang/srt/speculative/ddtree_utils.py",
                                          "python/sglang/srt/mem_cache/memory_pool.py",
                                          "python/sglang/srt/arg_groups/overrides.py",
                                          "python/sglang/srt/layers/attention/dsa/dsa_indexer.py",
                                          "python/sglang/kernels/ops/attention/dsa/index_buf_accessor.py",
                                          "python/sglang/srt/models/deepseek_common/attention_backend_handler.py"}),
    "ddtree": ("ddtree-branches", PATCHED),
}


@pytest.fixture(scope="module", params=[s.name for s in SNAPSHOTS])
def checkout(request, tmp_path_factory):
    source = next(s for s in SNAPSHOTS if s.name == request.param)
    if source.snapshot_path() is None:
        pytest.fail(f"snapshot {source.snapshot} is missing from ../shared/sglang-src (set DDTREE_SGLANG_SNAPSHOTS)")
    repo = tmp_path_factory.mktemp(source.name) / "sglang"
    git_checkout(source.snapshot_path(), repo)
    return source.name, repo


def test_whole_series_with_no_version_flag_then_byte_identical_revert(checkout, capsys):
    name, repo = checkout
    series, patched = EXPECTED[name]
    tree = locate(repo)
    assert tree.version is None and tree.layout == "git checkout"  # nothing to read a release from
    before = tree_hashes(repo)

    assert cli(["patch", "check", str(repo)]) == 0
    assert f"would apply — series {series} " in capsys.readouterr().out
    report = patchtool.apply(repo)
    assert report.outcome == "applied" and report.series == series
    after = tree_hashes(repo)
    assert {f for f in before if before[f] != after.get(f)} == patched
    assert patchtool.apply(repo).outcome == "already applied" and tree_hashes(repo) == after
    assert patchtool.revert(repo).outcome == "reverted"
    assert tree_hashes(repo) == before


def test_the_series_can_be_named_from_the_inventory(checkout):
    _, repo = checkout
    assert patchtool.check(repo, series="sglang-0.5.14+").series == "sglang-0.5.14+"
    with pytest.raises(LookupError, match="no series named 'nope'"):
        patchtool.check(repo, series="nope")


def test_unseen_ddtree_tree_with_a_moved_anchor_is_refused_naming_file_and_hunk(tmp_path):
    repo = tmp_path / "sglang"
    git_checkout(SNAPSHOTS[0].snapshot_path(), repo)
    policy = repo / "python/sglang/srt/speculative/dflash_utils.py"
    anchor = "    return backend_name, (backend_name not in _DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS)\n"
    policy.write_text(policy.read_text().replace(anchor, "    return backend_name, backend_name not in SKIP\n"))
    before = tree_hashes(repo)
    with pytest.raises(patchtool.PatchError) as err:
        patchtool.apply(repo)
    message = str(err.value)
    assert "anchors moved" in message
    assert ("0001-dflash-tree-aware-verify-mask-policy.patch: sglang/srt/speculative/dflash_utils.py: hunk #1 @@"
            in message)
    assert tree_hashes(repo) == before  # all or nothing


def test_release_job_rows_for_ddtree_sources(tmp_path):
    rows = [check_ddtree_source(s) for s in load_sources()]
    by_name = {r.version.split(" @ ")[0]: r for r in rows}
    for source in SNAPSHOTS:
        row = by_name[source.name]
        assert row.version == f"{source.name} @ {source.commit[:8]} (snapshot)"
        assert row.series == EXPECTED[source.name][0]
        assert set(row.patches.values()) == {"applies"}, row.patches
    v2 = by_name["ddtree-v2"]
    assert v2.supported, (v2.failed_checks, v2.error)
    assert v2.checks_total == v2.checks_passed >= 19  # DDTree's own verify path and accept path among them
    # The older ddtree branch predates TritonAttnBackend's verify_splitkv_fwd hook: the patches apply,
    # but nothing would call our kernel there, and the row says so.
    old = by_name["ddtree"]
    assert not old.supported and any("verify_splitkv_fwd" in f for f in old.failed_checks), old.failed_checks
    assert not any("-1 positional" in f or f.endswith(": ") for f in old.failed_checks), old.failed_checks
    unfetched = [r for s, r in zip(load_sources(), rows, strict=True) if not s.snapshot]
    assert all("--fetch-git" in r.error and not r.supported for r in unfetched)  # no network: a row, not a crash
    matrix = run_release_job(["0.5.23"], out=tmp_path, ddtree_sources=SNAPSHOTS[:1])
    assert f"| {SNAPSHOTS[0].name} @ {SNAPSHOTS[0].commit[:8]} (snapshot) | ddtree-v2 | applies | applies | applies |" \
        in (tmp_path / "matrix.md").read_text()
    assert matrix.supported_all()


def test_the_v2_verify_step_copies_nothing_to_the_host_once_patched(tmp_path):
    """0005: the two device-to-host copies the real server's trace found in DDTree's step (the prefix lengths
    read for a flat mask our backend does not get, and the prefix sum's .item()) are gone, and the check that
    says so finds them in the branch as it is."""
    import ast

    from ddtree_ops.patched_checks import DDTREE_WORKER_V2, VERIFY_STEP, host_syncs

    source = next(s for s in SNAPSHOTS if s.name == "ddtree-v2")
    repo = tmp_path / "sglang"
    git_checkout(source.snapshot_path(), repo)
    worker = locate(repo).package / DDTREE_WORKER_V2

    def syncs() -> list[str]:
        return host_syncs(ast.parse(worker.read_text()), "DDTreeWorkerV2", VERIFY_STEP)

    before = syncs()
    assert any("prefix_lens.sum().item()" in s for s in before), before
    assert any("batch.seq_lens.to('cpu'" in s for s in before), before
    assert patchtool.apply(repo).outcome == "applied"
    assert syncs() == []
