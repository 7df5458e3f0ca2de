"""SGLang's real DDTree verify path (ddtree-v2 branch, patched by our tool) serves TARGET_VERIFY
through ddtree_kernels, eagerly and through the backend's own CUDA-graph methods, and agrees with
SGLang's own kernel (DDTREE_VERIFY_KERNEL=sglang) and the float64 reference. harness.py says what
is real and what is stood in.

    make test-sglang-gpu          # on the GPU machine (tests/README.md: the wheels it needs)
"""

from __future__ import annotations

import pytest
import torch

from ddtree_kernels.reference import tree_verify_reference
from ddtree_kernels.sglang import adapter as sglang_adapter
from ddtree_kernels.sglang import dsa_verify as sglang_dsa_verify
from ddtree_kernels.sglang.verify_stats import VerifyStats

from .harness import MAX_BS, PARALLEL, Layout, ddtree_verify_input, import_sglang, make_backend, runner, sglang_source

pytestmark = pytest.mark.gpu
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SCALE = 1 / 16  # GLM-5: 1 / sqrt(192 + 64)
FP8 = torch.float8_e4m3fn


@pytest.fixture(scope="module")
def sg(tmp_path_factory):
    modules = import_sglang(sglang_source(tmp_path_factory.mktemp("sglang")))
    with modules.get_parallel().override(**PARALLEL):
        yield modules


@pytest.fixture
def stats(monkeypatch):
    fresh = VerifyStats()
    monkeypatch.setattr(sglang_adapter, "STATS", fresh)
    monkeypatch.setattr(sglang_dsa_verify, "STATS", fresh)
    return fresh


class Verify:
    """One TARGET_VERIFY of `bs` requests over random prefixes at random slots of the real pool."""

    def __init__(self, sg, run, layout: Layout, prefix_lens: list[int], n: int, seed: int, mask: bool = True):
        gen = torch.Generator().manual_seed(seed)
        self.sg, self.run, self.layout, self.n = sg, run, layout, n
        bs, T, H = len(prefix_lens), len(prefix_lens) * n, layout.heads
        slots = torch.randperm(layout.pool_tokens - 1, generator=gen)[: sum(prefix_lens) + T] + 1  # slot 0: padding
        pool = run.token_to_kv_pool
        rows = torch.randn(sum(prefix_lens), 1, 576, generator=gen)
        pool.set_kv_buffer(_layer(sg, H), slots[: sum(prefix_lens)].to(DEVICE), rows[..., :576].to(DEVICE),
                           rows[..., :512].to(DEVICE))
        self.req_pool_indices = torch.arange(bs, dtype=torch.int64, device=DEVICE)
        start = 0
        for b, p in enumerate(prefix_lens):
            run.req_to_token_pool.req_to_token[b, :p] = slots[start:start + p].to(DEVICE, torch.int32)
            start += p
        self.out_cache_loc = slots[sum(prefix_lens):].to(DEVICE)
        self.seq_lens = torch.tensor(prefix_lens, dtype=torch.int64, device=DEVICE)
        self.prefix_lens = prefix_lens
        self.q = torch.randn(T, H, 576, generator=gen).to(DEVICE, torch.bfloat16)
        self.k = torch.randn(T, 1, 576, generator=gen).to(DEVICE, torch.bfloat16)
        self.v = self.k[..., :512]
        if mask:
            self.spec, vis = ddtree_verify_input(sg, prefix_lens, n, layout.budget, DEVICE, gen)
            self.visibility = vis.reshape(T, n)
        else:  # the drafter's forward: TARGET_VERIFY, no mask (ENCODER_ONLY attention)
            self.spec = sg.DDTreeVerifyInput(draft_token=None, positions=None, draft_token_num=n,
                                             tree_budget=layout.budget, custom_mask=None)
            self.visibility = torch.ones(T, n, dtype=torch.bool)

    def batch(self):
        sg, bs = self.sg, len(self.prefix_lens)
        return sg.ForwardBatch(forward_mode=sg.ForwardMode.TARGET_VERIFY, batch_size=bs,
                               input_ids=torch.zeros(bs * self.n, dtype=torch.int64, device=DEVICE),
                               req_pool_indices=self.req_pool_indices, seq_lens=self.seq_lens,
                               out_cache_loc=self.out_cache_loc, seq_lens_sum=sum(self.prefix_lens),
                               spec_info=self.spec, seq_lens_cpu=self.seq_lens.cpu())

    def reference(self) -> torch.Tensor:
        pool = self.run.token_to_kv_pool
        kv_indptr = torch.tensor([0, *torch.tensor(self.prefix_lens).cumsum(0).tolist()])
        kv_indices = torch.cat([self.run.req_to_token_pool.req_to_token[b, :p].cpu().long()
                                for b, p in enumerate(self.prefix_lens)])
        qo = torch.arange(0, len(self.prefix_lens) + 1) * self.n
        k_cache = pool.get_key_buffer(0).float()
        out, _ = tree_verify_reference(self.q.cpu(), k_cache.cpu(), k_cache[..., :512].cpu(), kv_indptr, kv_indices,
                                       self.k.cpu(), self.v.cpu(), qo, self.visibility, SCALE)
        return out


def _layer(sg, heads: int, encoder_only: bool = False):
    attn_type = sg.AttentionType.ENCODER_ONLY if encoder_only else sg.AttentionType.DECODER
    return sg.RadixAttention(heads, 576, SCALE, 1, layer_id=0, v_head_dim=512, attn_type=attn_type)


def _eager(backend, case: Verify, layer) -> torch.Tensor:
    backend.init_forward_metadata(case.batch())
    out = backend.forward_extend(case.q, case.k, case.v, layer, case.batch(), save_kv_cache=True)
    return out.view(-1, case.layout.heads, 512).float().cpu()


def _close(got: torch.Tensor, want: torch.Tensor, tol: float) -> None:
    err = (got.double() - want.double()).abs().max().item()
    assert err <= tol, f"max abs error {err:.4f} > {tol}"


def _close_to_sglang(ours: torch.Tensor, theirs: torch.Tensor, reference: torch.Tensor, tol: float,
                     fp8: bool) -> None:
    """Ours against SGLang's own kernel. With an fp8 cache SGLang's kernel is the less exact of the two,
    so there ours must be at least as close to the reference."""
    # Under TRITON_INTERPRET (a CPU run while developing) SGLang's kernel takes bf16 tl.dot, which the
    # interpreter computes wrongly; there only the float64 reference holds ours to account.
    if DEVICE != "cuda":
        return
    if fp8:
        def err(x):
            return (x.double() - reference.double()).abs().max().item()

        assert err(ours) <= err(theirs) + 1e-3, (err(ours), err(theirs))
    else:
        _close(ours, theirs, tol)


def test_patched_registry_builds_our_backend(sg):
    run = runner(sg, Layout(), DEVICE)
    ours, theirs = make_backend(sg, run, "ddtree"), make_backend(sg, run, "sglang")
    assert type(ours).__name__ == "DDTreeTritonAttnBackend" and isinstance(ours, sg.TritonAttnBackend)
    assert ours.use_verify_splitkv and type(theirs) is sg.TritonAttnBackend and not theirs.use_verify_splitkv
    assert ours.ddtree_verify_width == 16  # budget 8 + 1 is narrower than the DFlash block of 16


CASES = {
    "glm5-bf16-n9": (Layout(heads=8, budget=8), [700], 9),
    "ragged-bs3-bf16": (Layout(heads=16, budget=8), [33, 1000, 257], 9),
    "fp8-cache-n17": (Layout(heads=8, kv_dtype=FP8, budget=16), [900, 120], 17),
}


@pytest.mark.parametrize("name", list(CASES))
def test_eager_verify_is_served_by_our_kernel_and_matches(sg, stats, name):
    layout, prefix_lens, n = CASES[name]
    run = runner(sg, layout, DEVICE)
    case = Verify(sg, run, layout, prefix_lens, n, seed=len(name))
    layer = _layer(sg, layout.heads)
    ours = _eager(make_backend(sg, run, "ddtree"), case, layer)
    assert stats.served == 1 and stats.declined == {}, (stats.served, stats.declined)  # our kernel, no fallback
    reference = case.reference()
    _close(ours, reference, 2e-2)
    theirs = _eager(make_backend(sg, run, "sglang"), case, layer)
    assert stats.served == 1  # SGLang's own backend never calls the hook
    _close_to_sglang(ours, theirs, reference, 2e-2, fp8=layout.kv_dtype == FP8)


def test_eager_verify_fed_the_visibility_is_served_and_a_declined_call_gets_the_flat_mask(sg, stats):
    """Patch 0004: DDTree hands our backend the tree's [bs, n, n] visibility and no flat mask. Our kernel serves
    it; a call it declines (logit soft-capping) gets the flat mask written, equal to DDTree's own compiler's."""
    layout, prefix_lens, n = CASES["glm5-bf16-n9"]
    run = runner(sg, layout, DEVICE)
    case = Verify(sg, run, layout, prefix_lens, n, seed=11)
    flat = case.spec.custom_mask
    case.spec.visibility = case.visibility.view(len(prefix_lens), n, n).to(DEVICE)
    case.spec.custom_mask = None
    ours = _eager(make_backend(sg, run, "ddtree"), case, _layer(sg, layout.heads))
    assert stats.served == 1 and stats.declined == {}, (stats.served, stats.declined)
    _close(ours, case.reference(), 2e-2)

    backend = make_backend(sg, run, "ddtree")
    capped = sg.RadixAttention(layout.heads, 576, SCALE, 1, layer_id=0, v_head_dim=512, logit_cap=30.0)
    backend.init_forward_metadata(case.batch())
    assert backend.forward_metadata.custom_mask is None
    # SGLang's own kernel then runs (its output is not checked: under the interpreter its bf16 dots are wrong)
    backend.forward_extend(case.q, case.k, case.v, capped, case.batch(), save_kv_cache=True)
    assert "logit soft-capping" in str(stats.declined)
    assert torch.equal(backend.forward_metadata.custom_mask.cpu(), flat.cpu())


def test_drafter_call_shape_is_served(sg, stats):
    """The DFlash drafter runs TARGET_VERIFY too: ENCODER_ONLY attention, no mask."""
    layout = Layout(heads=8, budget=8)
    run = runner(sg, layout, DEVICE)
    case = Verify(sg, run, layout, [300, 40], 9, seed=7, mask=False)
    layer = _layer(sg, layout.heads, encoder_only=True)
    ours = _eager(make_backend(sg, run, "ddtree"), case, layer)
    assert stats.served == 1 and stats.declined == {}
    reference = case.reference()
    _close(ours, reference, 2e-2)
    _close_to_sglang(ours, _eager(make_backend(sg, run, "sglang"), case, layer), reference, 2e-2, fp8=False)


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, FP8], ids=["bf16", "fp8"])
def test_the_backend_owns_a_workspace_for_every_captured_batch_size(sg, kv_dtype):
    """Read from SGLang's real MLA pool: the cache dtype and value layout, D_V 512 + 64; one workspace that
    every verify plan up to the captured batch size fits, passed to the hook with the backend's target."""
    from ddtree_kernels.launcher import Workspace, plan_verify
    from ddtree_kernels.sglang.triton_backend import reserve_verify_workspace

    layout = Layout(heads=8, kv_dtype=kv_dtype, budget=8, pool_tokens=4_096, context_len=2_048)
    backend = make_backend(sg, runner(sg, layout, DEVICE), "ddtree")
    workspace = reserve_verify_workspace(backend, 4)
    assert isinstance(workspace, Workspace) and workspace.d_v == 512
    n = backend.ddtree_verify_width
    plans = [plan_verify(bs, 8, n, bs * n, backend.ddtree_config.target, kv_fp8=kv_dtype == FP8) for bs in range(1, 5)]
    assert all(workspace.fits(plan) for plan in plans)
    assert workspace.lse_flat.numel() == max(Workspace.part_rows(plan) for plan in plans)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, FP8], ids=["bf16", "fp8"])
def test_cuda_graph_capture_then_replay_new_trees_prefixes_and_slots(sg, stats, kv_dtype):
    """The backend's own graph methods: state for MAX_BS requests of budget + 1 tokens, one capture, then
    replays with new trees, prefix lengths and slots, the last one at the server's context length."""
    layout = Layout(heads=8, kv_dtype=kv_dtype, budget=64, pool_tokens=40_000, context_len=16_384)
    n = layout.budget + 1
    run = runner(sg, layout, DEVICE)
    backend = make_backend(sg, run, "ddtree")
    backend.init_cuda_graph_state(MAX_BS, MAX_BS * n)
    assert backend.ddtree_verify_width == n
    layer = _layer(sg, layout.heads)

    capture = Verify(sg, run, layout, [100, 200], n, seed=1)
    q, k = capture.q.clone(), capture.k.clone()
    v = k[..., :512]  # the values are the latent columns of the same rows, as in the model
    fb = capture.batch()
    backend.init_forward_metadata_out_graph(fb, in_capture=True)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up: compile outside the capture
        backend.forward_extend(q, k, v, layer, fb, save_kv_cache=False)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = backend.forward_extend(q, k, v, layer, fb, save_kv_cache=False)
    captured = stats.served

    full = layout.context_len - n  # a request at the context length: prefix + its n draft tokens
    for seed, prefix_lens in enumerate([[150, 90], [4000, 33], [full, 7]], start=2):
        case = Verify(sg, run, layout, prefix_lens, n, seed=seed)
        q.copy_(case.q)
        k.copy_(case.k)
        replay = case.batch()
        backend.init_forward_metadata_out_graph(replay, in_capture=False)
        graph.replay()
        torch.cuda.synchronize()
        got = out.view(-1, layout.heads, 512).float().cpu()
        _close(got, case.reference(), 3e-2 if kv_dtype == FP8 else 2e-2)
    assert captured >= 1 and stats.declined == {}
    assert stats.served == captured  # replays run the captured kernels; the Python hook is not called again


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, FP8])
def test_the_mla_pool_moves_every_layer_in_one_launch_as_the_loop_did(sg, kv_dtype):
    """Patch 0006: the real MLATokenToKVPool moves the accepted rows of all its layers with SGLang's
    all-layer byte copy, and every layer ends as the gather-then-scatter loop left it: paths whose rows
    read a slot a later row writes (a_i >= i, as DDTree's and EAGLE's moves are), padding rows to slot 0,
    and a move of 300 rows (two chunks) with such a read across the chunk boundary. On CUDA through
    move_kv_cache; on a CPU (developing) the same method runs under Triton's interpreter."""
    gen = torch.Generator().manual_seed(6)
    pool = sg.MLATokenToKVPool(1024, page_size=1, dtype=kv_dtype, kv_lora_rank=512, qk_rope_head_dim=64,
                               layer_num=5, device=DEVICE, enable_memory_saver=False)
    for buf in pool.kv_buffer:
        buf.copy_(torch.randint(0, 120, buf.shape, generator=gen, dtype=torch.uint8).view(buf.dtype).to(DEVICE)
                  if buf.element_size() == 1 else torch.randn(buf.shape, generator=gen).to(DEVICE, buf.dtype))

    def path(first_slot: int, accepted: list[int]) -> tuple[list[int], list[int]]:
        return [first_slot + i for i in range(len(accepted))], [first_slot + a for a in accepted]

    moves = [path(20, [0, 2, 5]), path(40, [0, 1, 2, 3]), ([0, 0], [0, 0]), path(100, [0, *range(2, 300)])]
    for tgt, src in moves:
        tgt_t = torch.tensor(tgt, dtype=torch.int64, device=DEVICE)
        src_t = torch.tensor(src, dtype=torch.int64, device=DEVICE)
        expected = [buf.clone() for buf in pool.kv_buffer]
        for buf in expected:
            buf[tgt_t] = buf[src_t]
        if DEVICE == "cuda":
            pool.move_kv_cache(tgt_t, src_t)
        else:
            pool._move_kv_cache_all_layers(tgt_t, src_t)
        for layer, (got, want) in enumerate(zip(pool.kv_buffer, expected, strict=True)):
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), (layer, tgt[:4], src[:4])


# A DSA model (GLM-5) at DDTree's page size 1, patch 0007: SGLang's DSA pool keeps one 132-byte index row a token,
# its indexer stages the step's queries with our backend, and the backend ranks and attends them.
DSA_TOPK = 64  # fewer than the prefixes' keys, so the selection matters


def _dsa_keys(pool, slots: torch.Tensor, gen: torch.Generator) -> None:
    """Index keys at `slots`, quantised as SGLang's indexer does and stored by the real pool's own store."""
    from ddtree_kernels.dsa import act_quant

    k_fp8, k_scale = act_quant(torch.randn(slots.numel(), 128, generator=gen))
    pool.set_index_k_scale_buffer(layer_id=0, loc=slots.to(DEVICE), index_k=k_fp8.to(DEVICE),
                                  index_k_scale=k_scale[:, None].to(DEVICE))


def test_the_dsa_pool_at_page_size_1_keeps_keys_where_our_kernel_reads_them(sg):
    from ddtree_kernels.dsa import act_quant
    from ddtree_kernels.dsa.index_keys import read_index_keys

    run = runner(sg, Layout(dsa_topk=DSA_TOPK, pool_tokens=512), DEVICE)
    pool = run.token_to_kv_pool
    gen = torch.Generator().manual_seed(3)
    slots = torch.randperm(500, generator=gen)[:40] + 1
    keys = torch.randn(40, 128, generator=gen)
    k_fp8, k_scale = act_quant(keys)
    pool.set_index_k_scale_buffer(layer_id=0, loc=slots.to(DEVICE), index_k=k_fp8.to(DEVICE),
                                  index_k_scale=k_scale[:, None].to(DEVICE))
    got_k, got_s = read_index_keys(pool.get_index_k_with_scale_buffer(0), slots.to(DEVICE))
    assert torch.equal(got_k.view(torch.uint8).cpu(), k_fp8.view(torch.uint8)) and torch.equal(got_s.cpu(), k_scale)
    # DDTree's accept path moves a token's index row with its latent row
    src, dst = slots[:8].to(DEVICE), (torch.arange(8) + 501).to(DEVICE)
    pool.move_kv_cache(dst, src)
    moved_k, moved_s = read_index_keys(pool.get_index_k_with_scale_buffer(0), dst)
    assert torch.equal(moved_k.view(torch.uint8).cpu(), k_fp8[:8].view(torch.uint8))
    assert torch.equal(moved_s.cpu(), k_scale[:8])


@pytest.mark.parametrize(("prefix_lens", "n"), [([700], 9), ([40, 300], 9)], ids=["glm5-n9", "bs2-short-prefix"])
def test_dsa_verify_is_ranked_and_attended_by_our_kernel_and_matches(sg, stats, prefix_lens, n):
    from ddtree_kernels.dsa import act_quant, dsa_tree_verify_reference

    layout = Layout(heads=8, budget=8, dsa_topk=DSA_TOPK)
    run = runner(sg, layout, DEVICE)
    backend = make_backend(sg, run, "ddtree")
    assert backend.ddtree_dsa is not None and backend.ddtree_dsa.topk == DSA_TOPK
    case = Verify(sg, run, layout, prefix_lens, n, seed=sum(prefix_lens))
    case.spec.visibility = case.visibility.view(len(prefix_lens), n, n).to(DEVICE)
    case.spec.custom_mask = None  # patch 0004: the compact visibility
    gen = torch.Generator().manual_seed(5)
    prefix_slots = torch.cat([run.req_to_token_pool.req_to_token[b, :p].cpu().long()
                              for b, p in enumerate(prefix_lens)])
    _dsa_keys(run.token_to_kv_pool, torch.cat([prefix_slots, case.out_cache_loc.cpu()]), gen)
    T = len(prefix_lens) * n
    index_q, q_scale = act_quant(torch.randn(T, 32, 128, generator=gen))
    weights = (torch.randn(T, 32, generator=gen) * 32**-0.5 * q_scale * 128**-0.5)[..., None].float()

    batch = case.batch()
    backend.init_forward_metadata(batch)
    # what the patched Indexer.forward_cuda does with the metadata our backend gives it
    backend.get_indexer_metadata(0, batch).ddtree_stage_index_query(0, index_q.to(DEVICE), weights.to(DEVICE))
    layer = _layer(sg, layout.heads)
    out = backend.forward_extend(case.q, case.k, case.v, layer, batch, save_kv_cache=True)
    assert stats.served_dsa == 1 and stats.declined == {}, (stats.served_dsa, stats.declined)

    pool = run.token_to_kv_pool
    kv_indptr = torch.tensor([0, *torch.tensor(prefix_lens).cumsum(0).tolist()])
    qo = torch.arange(0, len(prefix_lens) + 1) * n
    want, selections = dsa_tree_verify_reference(
        case.q.cpu(), pool.get_key_buffer(0).cpu(), kv_indptr, prefix_slots, qo, case.out_cache_loc.cpu(),
        case.visibility, index_q, weights[..., 0], pool.get_index_k_with_scale_buffer(0).cpu(), topk=DSA_TOPK,
        sm_scale=SCALE)
    assert max(s.slots.numel() for s in selections) == DSA_TOPK  # some token had more keys than it attends
    _close(out.view(T, layout.heads, 512).float().cpu(), want, 2e-2)


def test_a_dsa_layer_whose_indexer_did_not_stage_is_declined_and_counted(sg, stats):
    layout = Layout(heads=8, budget=8, dsa_topk=DSA_TOPK)
    run = runner(sg, layout, DEVICE)
    case = Verify(sg, run, layout, [200], 9, seed=9)
    case.spec.visibility = case.visibility.view(1, 9, 9).to(DEVICE)
    case.spec.custom_mask = None
    out = _eager(make_backend(sg, run, "ddtree"), case, _layer(sg, layout.heads))
    assert stats.served_dsa == 0 and "no index query staged for layer 0" in str(stats.declined)
    _close(out, case.reference(), 2e-2)  # the dense tree verify served it: every key attended


@pytest.mark.parametrize(("prefix_lens", "extend_lens"), [([0], [150]), ([60, 0], [40, 90])],
                         ids=["fresh-prompt", "bs2-cached-prefix"])
def test_a_dsa_prefill_longer_than_the_top_k_is_ranked_and_attended_sparse(sg, prefix_lens, extend_lens):
    """An EXTEND whose indexer staged its queries (the prompt has more keys than the top k): each prompt token
    attends the top k of its causal prefix (the float64 DSA reference with a chain for a tree), not every key."""
    from ddtree_kernels import masks
    from ddtree_kernels.dsa import act_quant, dsa_tree_verify_reference

    layout = Layout(heads=8, budget=8, dsa_topk=DSA_TOPK)
    run = runner(sg, layout, DEVICE)
    backend = make_backend(sg, run, "ddtree")
    assert backend.ddtree_dsa_prefill  # patch 0007's dispatch keeps the prompt on the MLA path for it
    gen = torch.Generator().manual_seed(11)
    bs, P, T = len(prefix_lens), sum(prefix_lens), sum(extend_lens)
    slots = torch.randperm(layout.pool_tokens - 1, generator=gen)[: P + T] + 1
    prefix_slots, new_slots = slots[:P], slots[P:]
    rows = torch.randn(P, 1, 576, generator=gen)
    pool = run.token_to_kv_pool
    pool.set_kv_buffer(_layer(sg, layout.heads), prefix_slots.to(DEVICE), rows.to(DEVICE), rows[..., :512].to(DEVICE))
    p0 = e0 = 0
    for b, (p, e) in enumerate(zip(prefix_lens, extend_lens, strict=True)):
        run.req_to_token_pool.req_to_token[b, :p + e] = torch.cat(
            [prefix_slots[p0:p0 + p], new_slots[e0:e0 + e]]).to(DEVICE, torch.int32)
        p0, e0 = p0 + p, e0 + e
    _dsa_keys(pool, slots, gen)
    q = torch.randn(T, layout.heads, 576, generator=gen).to(DEVICE, torch.bfloat16)
    k = torch.randn(T, 1, 576, generator=gen).to(DEVICE, torch.bfloat16)
    index_q, q_scale = act_quant(torch.randn(T, 32, 128, generator=gen))
    weights = (torch.randn(T, 32, generator=gen) * 32**-0.5 * q_scale * 128**-0.5)[..., None].float()
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens, strict=True)]
    batch = sg.ForwardBatch(
        forward_mode=sg.ForwardMode.EXTEND, batch_size=bs, input_ids=torch.zeros(T, dtype=torch.int64, device=DEVICE),
        req_pool_indices=torch.arange(bs, device=DEVICE), seq_lens=torch.tensor(seq_lens, device=DEVICE),
        out_cache_loc=new_slots.to(DEVICE), seq_lens_sum=sum(seq_lens), seq_lens_cpu=torch.tensor(seq_lens),
        extend_prefix_lens=torch.tensor(prefix_lens, dtype=torch.int32, device=DEVICE),
        extend_seq_lens=torch.tensor(extend_lens, dtype=torch.int32, device=DEVICE),
        extend_prefix_lens_cpu=prefix_lens, extend_seq_lens_cpu=extend_lens)
    backend.init_forward_metadata(batch)
    backend.get_indexer_metadata(0, batch).ddtree_stage_index_query(0, index_q.to(DEVICE), weights.to(DEVICE))
    out = backend.forward_extend(q, k, k[..., :512], _layer(sg, layout.heads), batch, save_kv_cache=True)

    kv_indptr = torch.tensor([0, *torch.tensor(prefix_lens).cumsum(0).tolist()])
    qo = torch.tensor([0, *torch.tensor(extend_lens).cumsum(0).tolist()], dtype=torch.int32)
    want, selections = dsa_tree_verify_reference(
        q.cpu(), pool.get_key_buffer(0).cpu(), kv_indptr, prefix_slots, qo, new_slots,
        masks.chain_visibility(qo, max(extend_lens)), index_q, weights[..., 0],
        pool.get_index_k_with_scale_buffer(0).cpu(), topk=DSA_TOPK, sm_scale=SCALE)
    assert max(s.slots.numel() for s in selections) == DSA_TOPK  # later prompt tokens attend fewer keys than they see
    _close(out.view(T, layout.heads, 512).float().cpu(), want, 2e-2)
