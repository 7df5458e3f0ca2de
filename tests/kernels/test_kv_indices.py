"""Our backend's KV index fill: the same list SGLang's one-program-a-request fill builds, replacing it only where
SGLang's method is exactly the one it replaces (the kernel runs for real: GPU or Triton's interpreter)."""

from __future__ import annotations

import importlib.util
import textwrap
import types

import torch

from ddtree_kernels.sglang import triton_backend
from ddtree_kernels.sglang.kv_indices import BLOCK, PROGRAMS, fill_kv_indices, takes_kv_fill

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

SGLANG_FILL = '''
import torch

def create_flashinfer_kv_indices_triton(*args):
    raise AssertionError("SGLang's one-program fill ran; ours should have")

class TritonAttnBackend:
    def _fill_kv_indptr_and_indices(
        self,
        bs: int,
        seq_lens: torch.Tensor,
        req_pool_indices: torch.Tensor,
        kv_indices: torch.Tensor,
    ) -> torch.Tensor:
        kv_indptr = self.kv_indptr[: bs + 1]
        kv_indptr[1:] = torch.cumsum(seq_lens, dim=0)
        create_flashinfer_kv_indices_triton[(bs,)](
            self.req_to_token,
            req_pool_indices,
            seq_lens,
            kv_indptr,
            None,
            kv_indices,
            self.req_to_token.stride(0),
        )
        return kv_indptr
'''


def _module(tmp_path, source: str, name: str) -> types.ModuleType:
    """A stand-in TritonAttnBackend with the method's text as SGLang writes it (inspect reads it from the file)."""
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _problem(lengths: list[int], pool: int = 6, width: int = 140_100):
    gen = torch.Generator().manual_seed(len(lengths))
    req_to_token = torch.randint(0, 2**30, (pool, width), generator=gen, dtype=torch.int32)
    req_pool_indices = torch.randperm(pool, generator=gen)[: len(lengths)]
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    kv_indptr = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    kv_indptr[1:] = torch.cumsum(seq_lens, 0)
    expected = torch.cat([req_to_token[p, :n] for p, n in zip(req_pool_indices.tolist(), lengths, strict=True)])
    return [t.to(DEVICE) for t in (req_to_token, req_pool_indices, seq_lens, kv_indptr)], expected.long()


def test_fill_matches_the_rows_across_every_pass():
    # 140,000 tokens: past PROGRAMS * BLOCK, so each program takes a second pass; 0 and 1 at the edges.
    assert PROGRAMS * BLOCK < 140_000
    (req_to_token, pools, lens, indptr), expected = _problem([5, 140_000, 0, 1, 1500])
    out = torch.full((expected.numel() + 9,), -1, dtype=torch.int64, device=DEVICE)
    fill_kv_indices(req_to_token, pools, lens, indptr, out)
    assert torch.equal(out[: expected.numel()].cpu(), expected)
    assert (out[expected.numel():] == -1).all(), "wrote past the list"


def test_only_the_requests_of_the_batch(tmp_path):
    (req_to_token, pools, lens, indptr), expected = _problem([7, 9, 11])
    out = torch.full((expected.numel(),), -1, dtype=torch.int64, device=DEVICE)
    fill_kv_indices(req_to_token, pools, lens, indptr, out, bs=2)  # SGLang passes padded index buffers
    assert torch.equal(out[:16].cpu(), expected[:16]) and (out[16:] == -1).all()


def test_backend_replaces_sglangs_fill_with_the_same_list(tmp_path):
    base = _module(tmp_path, SGLANG_FILL, "sglang_fill").TritonAttnBackend
    assert takes_kv_fill(base)
    cls = triton_backend.ddtree_backend_class(base)
    backend = object.__new__(cls)
    (req_to_token, pools, lens, _), expected = _problem([300, 2, 4097])
    backend.req_to_token = req_to_token
    backend.kv_indptr = torch.zeros(8, dtype=torch.int32, device=DEVICE)
    out = torch.empty(expected.numel(), dtype=torch.int64, device=DEVICE)
    indptr = backend._fill_kv_indptr_and_indices(3, lens, pools, out)
    assert indptr.tolist() == [0, 300, 302, 4399]
    assert torch.equal(out.cpu(), expected)


def test_a_different_fill_is_left_alone(tmp_path):
    translated = SGLANG_FILL.replace("create_flashinfer_kv_indices_triton[(bs,)](",
                                     "self.kv_index_translator.fill(")
    base = _module(tmp_path, translated, "sglang_translated").TritonAttnBackend
    assert not takes_kv_fill(base)
    assert "_fill_kv_indptr_and_indices" not in vars(triton_backend.ddtree_backend_class(base))
