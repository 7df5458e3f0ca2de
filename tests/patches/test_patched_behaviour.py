"""The patched mask policy and routing, run from the real patched source of each release.

ddtree_ops.patched_checks extracts the patched functions with ast (SGLang itself does not
import without its GPU dependencies) and runs them against name-matched stand-ins that its
contract checks hold to the same release's real TritonAttnBackend.
"""

from __future__ import annotations

import pytest

from ddtree_ops import patchtool
from ddtree_ops.patched_checks import all_checks, policy_checks, routing_checks
from ddtree_ops.sglang_tree import locate

from .conftest import RELEASES


@pytest.mark.parametrize("version", RELEASES)
def test_patched_policy_and_routing(pristine, version):
    target = pristine(version)
    patchtool.apply(target)
    results = all_checks(locate(target))
    failed = [f"{r.name}: {r.detail}" for r in results if not r.ok]
    assert not failed, failed
    names = {r.name for r in results}
    assert any("tree refused" in n for n in names) and any("routes TARGET_VERIFY" in n for n in names)


def test_the_checks_fail_on_unpatched_source(pristine):
    """Guard the guards: SGLang's own code verifies a tree on Triton as a chain and never routes to us."""
    tree = locate(pristine("0.5.23"))
    policy = {r.name: r.ok for r in policy_checks(tree)}
    assert policy["policy: tree forces the mask on Triton"] is False
    assert policy["policy: tree refused on a backend that cannot mask"] is False
    assert policy["policy: chain verify unchanged"] is True  # nothing to change for a chain
    routing = {r.name: r.ok for r in routing_checks(tree)}
    assert routing["routing: default routes TARGET_VERIFY to ddtree_kernels"] is False
