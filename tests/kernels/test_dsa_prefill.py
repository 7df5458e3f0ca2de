"""The DSA prefill (chunks of the chain tree verify) against the float64 reference of the whole prompt at once: a
prompt token attends the top-k of its causal prefix, wherever the chunks fall."""

from __future__ import annotations

import pytest
import torch

from ddtree_kernels.dsa.prefill import DSAPrefill

from .cases import DEVICE, TARGET
from .dsa_cases import make_dsa_case
from .test_dsa import _check


@pytest.mark.parametrize(("prefix", "tokens", "chunk", "topk"), [
    (0, 19, 8, 6),  # a fresh prompt: chunks of 8, the last one short, top-k below most prefixes
    (40, 13, 8, 16),  # an extend after a cached prefix
    (0, 30, 8, 20),  # the first chunks' keys all fit the top-k: the dense shortcut, then the sparse chunks
])
def test_prefill_in_chunks_matches_the_whole_prompt(prefix, tokens, chunk, topk):
    case = make_dsa_case([prefix], [tokens], 8, DEVICE, topk=topk, tree="chain")
    slots = torch.cat([case.kv_indices, case.tree_slots]).to(torch.int64)
    prefill = DSAPrefill(num_heads=8, max_context=prefix + tokens, target=TARGET, topk=topk, chunk=chunk)
    out = torch.full((tokens, 8, 512), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    prefill.run(case.q, case.k_buf, slots, prefix, case.index_q, case.index_weights, case.index_buf, out,
                sm_scale=case.sm_scale, k_scale=case.k_scale)
    _check(case, out)


def test_a_request_longer_than_planned_is_refused():
    prefill = DSAPrefill(num_heads=8, max_context=100, target=TARGET, chunk=16)
    q = torch.zeros(200, 8, 576, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match="longer than the 100 planned"):
        prefill.run(q, q, torch.zeros(300, dtype=torch.int64, device=DEVICE), 100, q, q, q, q, sm_scale=1.0)
