"""A DDTree verify fed the tree's compact visibility (patch 0004) instead of SGLang's flat mask.

The backend class is built over a stand-in for SGLang's TritonAttnBackend that holds only what the
subclass touches (forward_metadata, the two metadata entry points, init_cuda_graph_state); the
real class is held to those names and signatures by ddtree_ops.patched_checks (contract checks,
run on the real DDTree source in tests/patches). The kernels run for real (on the GPU or
through Triton's interpreter) and are checked against the float64 reference.
"""

from __future__ import annotations

import types

import pytest
import torch

from ddtree_kernels.sglang import sglang_verify_fwd, triton_backend
from ddtree_kernels.sglang.flat_mask import write_sglang_flat_mask

from .cases import DEVICE, TARGET, assert_close, make_case

N = 5  # DDTree verifies the same width for every request of a batch
WIDTH = 9  # the worker's buffers: budget + 1 wide


def _case(seed: int = 0):
    return make_case([40, 70, 1], [N, N, N], 8, DEVICE, seed=seed)


def _worker_visibility(case) -> torch.Tensor:
    """The tree as DDTreeWorkerV2 hands it over: [bs, n, n], a slice of a [bs, budget + 1, budget + 1] buffer."""
    bs = case.qo_indptr.shape[0] - 1
    buf = torch.zeros((bs, WIDTH, WIDTH), dtype=torch.bool, device=DEVICE)
    buf[:, :N, :N] = case.visibility.view(bs, N, -1)[:, :, :N]
    return buf[:, :N, :N]


class _Mode:
    def __init__(self, verify: bool):
        self.verify = verify

    def is_target_verify(self) -> bool:
        return self.verify


class _TritonAttnBackend:
    """Stand-in for SGLang's TritonAttnBackend (see the module docstring): metadata only, no kernels."""

    def __init__(self, model_runner):
        self.device = DEVICE
        self.max_context_len = 128
        self.num_draft_tokens = N
        self.forward_metadata = None
        self.cuda_graph_custom_mask = None

    def init_cuda_graph_state(self, max_bs, max_num_tokens):
        self.cuda_graph_custom_mask = torch.zeros(max_num_tokens * self.max_context_len, dtype=torch.bool,
                                                  device=self.device)

    def init_forward_metadata(self, forward_batch):
        self.forward_metadata = types.SimpleNamespace(custom_mask=forward_batch.spec_info.custom_mask)

    def init_forward_metadata_out_graph(self, forward_batch, in_capture=False):
        if in_capture:
            self.forward_metadata = types.SimpleNamespace(custom_mask=self.cuda_graph_custom_mask)


def _backend():
    runner = types.SimpleNamespace(server_args=types.SimpleNamespace(
        speculative_algorithm="DDTREE", speculative_num_draft_tokens=16, speculative_ddtree_budget=WIDTH - 1))
    return triton_backend.ddtree_backend_class(_TritonAttnBackend)(runner)


def _batch(visibility, bs, custom_mask=None):
    spec = types.SimpleNamespace(visibility=visibility, draft_token_num=N, custom_mask=custom_mask)
    return types.SimpleNamespace(forward_mode=_Mode(True), spec_info=spec, batch_size=bs)


def _verify(backend, case, out, **kwargs):
    """The call forward_extend makes: 16 positional arguments, the flat mask from forward_metadata."""
    return backend.verify_splitkv_fwd(
        case.q, case.k_draft, case.v_draft, out, case.k_cache, case.v_cache,
        case.qo_indptr, case.kv_indptr, case.kv_indices,
        backend.forward_metadata.custom_mask, False, case.mask_indptr, N, 1.0, 1.0, case.sm_scale, **kwargs)


def test_flat_mask_writer_matches_sglang_layout():
    case = _case(1)
    out = torch.zeros(case.custom_mask.numel() + 7, dtype=torch.bool, device=DEVICE)
    write_sglang_flat_mask(case.visibility, case.qo_indptr, case.kv_indptr, case.mask_indptr, out, N)
    assert torch.equal(out[: case.custom_mask.numel()].cpu(), case.custom_mask.cpu())
    assert not out[case.custom_mask.numel():].any(), "wrote past the last request's block"


def test_hook_reads_the_visibility_rows_as_the_flat_mask():
    case = _case(2)
    ref, _ = case.reference()
    outs = []
    for kwargs in (dict(custom_mask=case.custom_mask), dict(custom_mask=None, tree_visibility=case.visibility)):
        out = torch.full_like(case.q[..., : case.d_v], float("nan"))
        mask = kwargs.pop("custom_mask")
        assert sglang_verify_fwd(case.q, case.k_draft, case.v_draft, out, case.k_cache, case.v_cache,
                                    case.qo_indptr, case.kv_indptr, case.kv_indices, mask, False,
                                    case.mask_indptr, N, 1.0, 1.0, case.sm_scale, **kwargs, target=TARGET)
        assert_close(out, ref, case)
        outs.append(out)
    assert torch.equal(outs[0], outs[1])


def test_eager_verify_takes_the_visibility():
    case = _case(3)
    backend = _backend()
    backend.init_forward_metadata(_batch(_worker_visibility(case), 3))
    assert torch.equal(backend._tree_rows.bool().cpu(), case.visibility[:, :N].cpu())
    out = torch.full_like(case.q[..., : case.d_v], float("nan"))
    assert _verify(backend, case, out)
    assert_close(out, case.reference()[0], case)


def test_declined_call_gets_the_flat_mask_written():
    case = _case(4)
    backend = _backend()
    backend.init_forward_metadata(_batch(_worker_visibility(case), 3))
    assert backend.forward_metadata.custom_mask is None
    out = torch.zeros_like(case.q[..., : case.d_v])
    assert not _verify(backend, case, out, logit_cap=30.0)  # declined: SGLang's own path runs next
    assert not out.any()
    assert torch.equal(backend.forward_metadata.custom_mask.cpu(), case.custom_mask.cpu())


def test_flat_mask_kept_where_the_worker_builds_it():
    case = _case(5)
    backend = _backend()
    backend.init_forward_metadata(_batch(_worker_visibility(case), 3, custom_mask=case.custom_mask))
    assert backend._tree_rows is None


def test_graph_replay_refills_the_captured_rows(monkeypatch):
    monkeypatch.setattr(triton_backend, "ddtree_feeds_visibility", lambda backend: True)
    backend = _backend()
    backend.init_cuda_graph_state(4, 4 * WIDTH)
    chain = torch.tril(torch.ones((4, N, N), dtype=torch.bool, device=DEVICE))
    backend.init_forward_metadata_out_graph(_batch(chain, 4), in_capture=True)  # as the graph runner captures
    captured, width = backend._tree_rows, backend.ddtree_verify_width  # 16: the DFlash block, wider than budget + 1
    assert captured.stride(0) == width and torch.equal(captured.view(4, N, width)[:, :, :N].bool(), chain)

    case = _case(6)  # 3 live requests replayed in the 4-request graph
    backend.init_forward_metadata_out_graph(_batch(_worker_visibility(case), 4))
    assert backend._tree_rows.data_ptr() == captured.data_ptr()
    out = torch.full_like(case.q[..., : case.d_v], float("nan"))
    assert _verify(backend, case, out)
    assert_close(out, case.reference()[0], case)


def test_graph_captured_for_visibility_refuses_a_replay_without_it(monkeypatch):
    monkeypatch.setattr(triton_backend, "ddtree_feeds_visibility", lambda backend: True)
    backend = _backend()
    backend.init_cuda_graph_state(4, 4 * WIDTH)
    full = torch.ones((4, N, N), dtype=torch.bool, device=DEVICE)
    backend.init_forward_metadata_out_graph(_batch(full, 4), in_capture=True)
    with pytest.raises(RuntimeError, match=r"spec_info\.visibility is None"):
        backend.init_forward_metadata_out_graph(_batch(None, 4))


def test_graph_without_the_patch_keeps_the_flat_mask():
    backend = _backend()  # no DDTree installed here: ddtree_feeds_visibility answers False
    backend.init_cuda_graph_state(4, 4 * WIDTH)
    full = torch.ones((4, N, N), dtype=torch.bool, device=DEVICE)
    backend.init_forward_metadata_out_graph(_batch(full, 4), in_capture=True)
    assert backend._tree_rows is None


def test_a_drafter_pass_without_the_tree_keeps_the_flat_path(monkeypatch):
    # The DFlash drafter's backend is ours too, and its TARGET_VERIFY-mode pass carries no tree: its graphs are
    # captured and replayed without rows (the first real server run died here when one flag served both).
    monkeypatch.setattr(triton_backend, "ddtree_feeds_visibility", lambda backend: True)
    backend = _backend()
    backend.init_cuda_graph_state(4, 4 * WIDTH)
    backend.init_forward_metadata_out_graph(_batch(None, 4), in_capture=True)
    assert backend._tree_rows is None
    backend.init_forward_metadata_out_graph(_batch(None, 4))  # replay: no error
    assert backend._tree_rows is None
