"""The CUDA-graph verify mask of our backend holds a DDTree verify at full context.

The base class below stands in for SGLang's TritonAttnBackend as the DDTree branches size the
mask (`init_cuda_graph_state`: zeros(max_num_tokens * max_context_len), triton_backend.py of the
ddtree-v2 snapshot) and fill it at replay (`custom_mask[: spec_info.custom_mask.shape[0]] =
spec_info.custom_mask`); the flat mask is SGLang's layout, a row-major [n, P + n] block a request.
"""

from __future__ import annotations

import types

import pytest
import torch

from ddtree_kernels.sglang.triton_backend import ddtree_backend_class, verify_width

MAX_CONTEXT = 2048
BLOCK = 16  # --speculative-num-draft-tokens (the DFlash block)


class _DDTreeBranchTriton:
    def __init__(self, model_runner):
        self.device = "cpu"
        self.max_context_len = MAX_CONTEXT
        self.num_draft_tokens = model_runner.server_args.speculative_num_draft_tokens
        self.cuda_graph_custom_mask = None

    def init_cuda_graph_state(self, max_bs, max_num_tokens, kv_indices_buf=None, cuda_graph_num_kv_splits_buf=None):
        self.cuda_graph_custom_mask = torch.zeros(max_num_tokens * self.max_context_len, dtype=torch.uint8)

    def replay_copy(self, flat_mask: torch.Tensor) -> None:
        self.cuda_graph_custom_mask[: flat_mask.shape[0]] = flat_mask


def _runner(budget: int | None, algorithm: str = "DDTREE"):
    args = types.SimpleNamespace(speculative_algorithm=algorithm, speculative_num_draft_tokens=BLOCK,
                                 speculative_ddtree_budget=budget)
    return types.SimpleNamespace(server_args=args)


def _full_context_tree_mask(bs: int, n: int) -> torch.Tensor:
    """bs requests of n draft tokens on prefixes at the context limit: [n, P + n] each, flattened."""
    prefix = MAX_CONTEXT
    blocks = [torch.ones(n, prefix + n, dtype=torch.uint8) for _ in range(bs)]
    return torch.cat([b.flatten() for b in blocks])


@pytest.mark.parametrize("budget", [8, 64])
def test_mask_holds_budget_plus_one_columns_at_full_context(budget):
    bs, n = 4, budget + 1
    flat = _full_context_tree_mask(bs, n)

    sglang_own = _DDTreeBranchTriton(_runner(budget))
    sglang_own.init_cuda_graph_state(bs, bs * n)
    ours = ddtree_backend_class(_DDTreeBranchTriton)(_runner(budget))
    ours.init_cuda_graph_state(bs, bs * n)

    assert ours.ddtree_verify_width == max(BLOCK, budget + 1)
    ours.replay_copy(flat)  # holds
    assert int(ours.cuda_graph_custom_mask[: flat.shape[0]].sum()) == flat.numel()
    with pytest.raises(RuntimeError):
        sglang_own.replay_copy(flat)  # the size SGLang allocates cannot take it


def test_old_width_rule_is_too_small_for_a_ddtree_budget():
    """Widened by the DFlash block (the rule before this fix), a budget-64 verify overflows at full context."""
    bs, n = 2, 65
    flat = _full_context_tree_mask(bs, n)
    block_sized = torch.zeros(bs * n * (MAX_CONTEXT + BLOCK), dtype=torch.uint8)
    with pytest.raises(RuntimeError):
        block_sized[: flat.shape[0]] = flat
    width_sized = torch.zeros(bs * n * (MAX_CONTEXT + verify_width(_runner(64).server_args)), dtype=torch.uint8)
    width_sized[: flat.shape[0]] = flat


def test_width_follows_the_server_arguments():
    assert verify_width(_runner(64).server_args) == 65
    assert verify_width(_runner(8).server_args) == BLOCK  # the block is wider than 9 tokens
    assert verify_width(_runner(None).server_args) == BLOCK  # DDTree without a budget: SGLang's default
    assert verify_width(_runner(64, algorithm="DFLASH").server_args) == BLOCK  # a chain ignores the budget
