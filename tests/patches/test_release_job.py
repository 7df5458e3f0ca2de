"""The release job on the fixed set of releases, and a release that breaks a patch."""

from __future__ import annotations

import json

from ddtree_ops.release_job import Matrix, check_release, run_release_job
from ddtree_ops.wheels import released_versions

from .conftest import RELEASES


def test_fixed_set_is_supported(tmp_path, capsys, caplog):
    matrix = run_release_job(RELEASES, out=tmp_path, ddtree_sources=[])  # DDTree rows: test_ddtree_sources.py
    assert [r.version for r in matrix.rows] == RELEASES
    assert matrix.supported_all(), [(r.version, r.error, r.patches, r.failed_checks) for r in matrix.rows]
    data = json.loads((tmp_path / "matrix.json").read_text())
    assert [r["supported"] for r in data["rows"]] == [True] * len(RELEASES)
    md = (tmp_path / "matrix.md").read_text()
    for v in RELEASES:
        assert f"| {v} | sglang-0.5.14+ | applies | applies | 18/18 | supported |" in md
    assert "[5/5] sglang 0.5.23 ... supported" in capsys.readouterr().out
    # the row's verdict alone: the checks' expected log lines (our backend built with no pool) are not printed
    assert not [r.getMessage() for r in caplog.records if r.name.startswith("ddtree_kernels")]


def test_a_release_that_breaks_a_patch_is_a_clear_row(pristine):
    """Simulate a future release that rewrote the mask policy's anchor line."""
    src = pristine("0.5.23")
    f = src / "sglang/srt/speculative/dflash_utils.py"
    anchor = "    return backend_name, (backend_name not in _DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS)\n"
    f.write_text(f.read_text().replace(anchor, "    return backend_name, backend_name not in SKIP\n"))
    row = check_release("0.5.24", tree_dir=src)
    assert not row.supported and not row.error
    verdict = row.patches["0001-dflash-tree-aware-verify-mask-policy.patch"]
    assert verdict.startswith("fails: sglang/srt/speculative/dflash_utils.py hunk #1 @@ -")
    assert row.patches["0002-triton-route-target-verify-to-ddtree-kernels.patch"] == "applies"
    md = Matrix("now", [row]).to_markdown()
    assert "| 0.5.24 |" in md and "NOT supported" in md


def test_a_release_that_cannot_be_fetched_is_a_row_not_a_crash():
    row = check_release("0.0.0.999")
    assert not row.supported and "could not download" in row.error


def test_pypi_lists_the_releases():
    versions = released_versions("0.5.14")
    assert versions[0] == "0.5.14" and "0.5.23" in versions
