"""The trained pair's code on the CPU (train_pair.py, corpus.py): its target forward against transformers' own
GlmMoeDsa and against the absorbed MLA SGLang decodes with, the drafter's visibility, the files SGLang reads, the
byte tokenizer, the server prompts, and a tiny pair trained for a few steps (the losses fall)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.server_gpu import corpus, e2e, models
from tests.server_gpu import train_pair as tp

SIZES, SCHED = tp.TINY


def _random_target(seed: int = 0) -> tp.Target:
    torch.manual_seed(seed)
    target = tp.Target(tp.target_config(SIZES))
    tp.init_weights(target, SIZES.layers)
    with torch.no_grad():  # norms away from 1 so a misplaced norm shows
        for p in target.parameters():
            if p.ndim == 1:
                p.add_(0.3 * torch.randn_like(p))
            else:
                p.mul_(3.0)
    return target.double()


def test_target_forward_equals_transformers_glm_moe_dsa():
    """Same weights, same tokens: the logits of transformers' GlmMoeDsaForCausalLM (eager, its indexer keeping every
    key of a short prompt, so dense) and ours, at PoSE-like positions far from 0."""
    from transformers import AutoConfig, AutoModelForCausalLM

    target = _random_target()
    cfg = tp.target_config(SIZES)
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg), attn_implementation="eager").double()
    missing, unexpected = hf.load_state_dict(target.state_dict(), strict=True)
    assert not missing and not unexpected
    ids = torch.randint(corpus.BYTE_OFFSET, corpus.TOKENIZER_SIZE, (2, 24))
    positions = torch.arange(24).expand(2, -1) + torch.tensor([[0], [150_000]])
    ours, _, _ = target(ids, positions)
    theirs = hf(input_ids=ids, position_ids=positions).logits
    # transformers' eager attention takes its softmax in float32 and its rotary tables are float32 (as ours):
    # within float32 rounding of a float64 forward, far below any difference in the math (a wrong rope layout,
    # scale or norm moves these logits by 1e-1)
    assert torch.allclose(ours, theirs, rtol=0, atol=2e-4), (ours - theirs).abs().max()


def test_mla_equals_the_absorbed_form_sglang_decodes_with():
    """SGLang's MLA decode and verify: q_nope absorbed through kv_b_proj's key half into the 512-wide latent, scores
    over the 576-wide cached rows [normed latent, roped k_pe], the output through the value half, then o_proj."""
    target = _random_target(1)
    attn = target.model.layers[0].self_attn
    b, t = 2, 20
    x = torch.randn(b, t, SIZES.hidden, dtype=torch.double)
    pos = torch.arange(t).expand(b, -1) + 777
    cos, sin = tp.rope_tables(pos, attn.rope, target.cfg["rope_parameters"]["rope_theta"])
    ours, _ = attn(x, cos.double(), sin.double())

    h, nope, rope, lora, vd = attn.h, attn.nope, attn.rope, attn.lora, attn.v
    q = attn.q_b_proj(attn.q_a_layernorm(attn.q_a_proj(x))).view(b, t, h, nope + rope)
    q_nope, q_pe = q.split([nope, rope], -1)
    c, k_pe = attn.kv_a_proj_with_mqa(x).split([lora, rope], -1)
    c = attn.kv_a_layernorm(c)
    w = attn.kv_b_proj.weight.view(h, nope + vd, lora)
    w_uk, w_uv = w[:, :nope], w[:, nope:]
    q_latent = torch.einsum("bthn,hnl->bthl", q_nope, w_uk)
    q_pe = tp.rope_interleaved(q_pe, cos[:, :, None].double(), sin[:, :, None].double())
    k_pe = tp.rope_interleaved(k_pe, cos.double(), sin.double())
    rows = torch.cat([c, k_pe], -1)  # the 576-wide latent rows the cache holds
    scores = torch.einsum("bthl,bsl->bhts", torch.cat([q_latent, q_pe], -1), rows) * attn.scale
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    o_latent = torch.einsum("bhts,bsl->bthl", scores.softmax(-1), c)
    absorbed = attn.o_proj(torch.einsum("bthl,hvl->bthv", o_latent, w_uv).reshape(b, t, h * vd))
    assert torch.allclose(ours, absorbed, rtol=1e-9, atol=1e-9)


def test_the_drafter_sees_only_the_context_before_its_anchor():
    torch.manual_seed(2)
    cfg = tp.drafter_config(SIZES)
    drafter = tp.Drafter(cfg).double()
    tp.init_weights(drafter, SIZES.draft_layers)
    b, t = 2, 40
    feats = torch.randn(b, t, len(cfg["dflash_config"]["target_layer_ids"]) * SIZES.hidden, dtype=torch.double)
    anchors = torch.tensor([[5, 20], [9, 30]])
    pos = torch.arange(t).expand(b, -1)
    emb = torch.randn(b, 2 * tp.BLOCK, SIZES.hidden, dtype=torch.double)
    block_pos = (pos.gather(1, anchors)[..., None] + torch.arange(tp.BLOCK)).reshape(b, -1)
    out = drafter(feats, pos, emb, block_pos, tp.draft_mask(anchors, t))
    later = feats.clone()
    later[0, 20:] += 1.0  # at and after window 0's second anchor: only that block's... nothing of block 0 changes
    out2 = drafter(later, pos, emb, block_pos, tp.draft_mask(anchors, t))
    assert torch.equal(out[0, :tp.BLOCK], out2[0, :tp.BLOCK])  # anchor 5 sees 0..4 only
    assert torch.equal(out[0, tp.BLOCK:], out2[0, tp.BLOCK:])  # anchor 20 sees 0..19 only
    earlier = feats.clone()
    earlier[0, 19] += 1.0
    out3 = drafter(earlier, pos, emb, block_pos, tp.draft_mask(anchors, t))
    assert torch.equal(out[0, :tp.BLOCK], out3[0, :tp.BLOCK]) and not torch.equal(out[0, tp.BLOCK:], out3[0, tp.BLOCK:])


def test_configs_hold_glm5s_attention_and_dflash_fields():
    cfg, dcfg = tp.target_config(tp.Sizes()), tp.drafter_config(tp.Sizes())
    assert cfg["architectures"] == ["GlmMoeDsaForCausalLM"] and cfg["model_type"] == "glm_moe_dsa"
    assert (cfg["num_attention_heads"], cfg["kv_lora_rank"], cfg["qk_rope_head_dim"], cfg["qk_nope_head_dim"],
            cfg["v_head_dim"]) == (8, 512, 64, 192, 256)
    assert (cfg["index_topk"], cfg["index_n_heads"], cfg["index_head_dim"]) == (2048, 32, 128)
    assert cfg["vocab_size"] == corpus.VOCAB and cfg["num_hidden_layers"] == 6
    assert dcfg["architectures"] == ["DFlashDraftModel"] and dcfg["num_target_layers"] == 6
    assert dcfg["dflash_config"] == {"target_layer_ids": [1, 2, 3], "mask_token": "<|MASK|>",
                                     "mask_token_id": corpus.MASK_ID, "block_size": 16}
    # the checkpoint's names and shapes are transformers' and SGLang's DFlash loader's
    assert {k: tuple(v.shape) for k, v in tp.Target(tp.target_config(SIZES)).state_dict().items()} == \
        models.target_shapes(tp.target_config(SIZES))
    small = tp.drafter_config(SIZES)
    assert {k: tuple(v.shape) for k, v in tp.Drafter(small).state_dict().items()} == models.drafter_shapes(small)


def test_dflash_layers_must_be_capturable():
    with pytest.raises(ValueError, match="distinct"):
        tp.target_layer_ids(tp.Sizes(layers=4, draft_layers=3))


def test_the_byte_tokenizer_round_trips_and_is_the_training_map(tmp_path):
    from transformers import AutoTokenizer

    corpus.write_tokenizer(tmp_path)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    text = "def f(x):\n    return x ** 2  # é ünïcode ✓ 😀\n\t"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids == corpus.encode(text.encode())
    assert tok.decode(ids) == text
    assert tok.mask_token_id == corpus.MASK_ID and tok.eos_token_id == corpus.EOS_ID
    assert tok.convert_tokens_to_ids("<|MASK|>") == corpus.MASK_ID and len(tok) == corpus.TOKENIZER_SIZE
    chat = tok.apply_chat_template([{"role": "user", "content": "List primes.\nComma-separated."}],
                                   add_generation_prompt=True, tokenize=False)
    assert chat == "# List primes.\n# Comma-separated.\n\n"  # Python comments: text the pair was trained on
    assert all(corpus.BYTE_OFFSET <= i < corpus.TOKENIZER_SIZE for i in tok.encode(chat, add_special_tokens=False))


def test_server_prompts_copy_a_recent_passage():
    for context in (4096, 8192):
        p = corpus.serve_prompt(context)
        assert len(p) == context and all(corpus.BYTE_OFFSET <= i < corpus.TOKENIZER_SIZE for i in p)
        passage_start = context - corpus.REPEAT - corpus.PASSAGE
        assert p[-corpus.REPEAT:] == p[passage_start: passage_start + corpus.REPEAT]
        assert corpus.serve_prompt(context) == p  # deterministic
    e2e.PROMPTS["trained"] = True
    try:
        assert e2e.bench_prompt(8192) == corpus.serve_prompt(8192)
        cmd = e2e.bench_command(["bench", "--contexts", "8192"])
        assert cmd[0] == e2e.PY and "corpus.serve_prompt(context)" in cmd[2]
    finally:
        e2e.PROMPTS["trained"] = False
    assert e2e.bench_command(["bench"]) == [e2e.OPS, "bench"]


def test_batches_paste_copies_and_skip_positions():
    tokens = torch.arange(10_000) % 200 + corpus.BYTE_OFFSET
    sched = tp.Schedule(seq=256, batch=64, copies=0.5, random_copies=0.0)
    ids, pos = tp.Batches(tokens, sched, "cpu")()
    assert ids.shape == pos.shape == (64, 256)
    steps = pos[:, 1:] - pos[:, :-1]
    assert ((steps == 1).sum(1) >= 254).all() and (steps >= 1).all()  # one jump at most, never backwards
    assert (pos.max(1).values > 1000).any() and (pos.max() < tp.MAX_POSITION)
    # a pasted copy breaks the text's own progression (+1 mod 200) somewhere in about half the windows
    breaks = ((ids[:, 1:] - ids[:, :-1]) % 200 != 1).sum(1)
    assert 10 < int((breaks > 0).sum()) < 54
    every, _ = tp.Batches(tokens, tp.Schedule(seq=256, batch=64, copies=1.0, random_copies=0.0), "cpu")()
    assert (((every[:, 1:] - every[:, :-1]) % 200 != 1).sum(1) > 0).all()  # copies=1: a copy in every window


def test_random_copies_paste_the_random_passage_they_put_earlier():
    """Every copy window's passage random (random_copies=1) over a text of no printable bytes: the printable
    positions are the passage and its paste, of one length and the same tokens; the other windows are the text."""
    tokens = torch.arange(10_000) % 120 + 128 + corpus.BYTE_OFFSET  # bytes 128-247, +1 each step
    ids, _ = tp.Batches(tokens, tp.Schedule(seq=256, batch=64, copies=0.5, random_copies=1.0), "cpu")()
    copies = 0
    for row in ids:
        at = torch.isin(row, tp.PRINTABLE).nonzero().flatten().tolist()
        if not at:
            assert ((row[1:] - row[:-1]) % 120 == 1).all()  # no copy: the text as it is
            continue
        copies += 1
        runs = [[at[0]]]
        for j in at[1:]:
            runs[-1].append(j) if j == runs[-1][-1] + 1 else runs.append([j])
        if len(runs) == 1:  # the paste right after its source
            runs = [runs[0][: len(runs[0]) // 2], runs[0][len(runs[0]) // 2:]]
        assert len(runs) == 2 and len(runs[0]) == len(runs[1]) >= 8, runs
        assert torch.equal(row[runs[0]], row[runs[1]])
    assert 10 < copies < 54  # about half the windows have a copy
    none = tp.Batches(tokens, tp.Schedule(seq=256, batch=64, copies=0.5, random_copies=0.0), "cpu")
    first, second = none(), none()
    assert not torch.isin(torch.cat([first[0], second[0]]), tp.PRINTABLE).any()
    # the random passages draw from their own generator: the windows' text and positions, batch after batch, are
    # those of any random_copies
    other = tp.Batches(tokens, tp.Schedule(seq=256, batch=64, copies=0.5, random_copies=1.0), "cpu")
    other()
    assert torch.equal(other()[1], second[1])


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    out = tmp_path_factory.mktemp("pair")
    return out, tp.train(out, SIZES, SCHED, device="cpu")


def test_a_tiny_pair_trains_and_is_saved_as_sglang_loads_it(tiny_pair):
    from safetensors.torch import load_file

    out, record = tiny_pair
    losses = [loss for _, loss, _ in record["target"]["loss"]]
    assert losses[-1] < 0.75 * losses[0], losses
    draft = [loss for _, loss, _ in record["drafter"]["loss"]]
    assert min(draft[1:]) < draft[0], draft
    assert (out / ".complete").exists()
    measured = json.loads((out / "train.json").read_text())["held_out"]
    assert set(measured) == {"next_token_accuracy_plain", "next_token_accuracy_copy_prompts",
                             "next_token_accuracy_in_the_repeat", "next_token_accuracy_in_random_pastes",
                             "chain_accept_length_plain", "chain_accept_length_copy_prompts"}
    # the copy probe ran every probe_every steps and after the last, on the same windows as the held-out figure
    probed = record["target"]["copy_accuracy"]
    assert [k for k, _ in probed] == [*range(0, SCHED.target_steps, SCHED.probe_every), SCHED.target_steps]
    assert all(0.0 <= a <= 1.0 for _, a in probed)
    assert probed[-1][1] == measured["next_token_accuracy_in_random_pastes"]
    assert 1.0 <= measured["chain_accept_length_plain"] <= 16.0
    cfg = json.loads((out / "target" / "config.json").read_text())
    dcfg = json.loads((out / "drafter" / "config.json").read_text())
    assert cfg == tp.target_config(SIZES) and dcfg == tp.drafter_config(SIZES)
    target = load_file(str(out / "target" / "model.safetensors"))
    assert {k: tuple(v.shape) for k, v in target.items()} == models.target_shapes(cfg)
    assert all(v.dtype == torch.bfloat16 for v in target.values())
    drafter = load_file(str(out / "drafter" / "model.safetensors"))
    assert {k: tuple(v.shape) for k, v in drafter.items()} == models.drafter_shapes(dcfg)
    for folder in ("target", "drafter"):
        assert (out / folder / "tokenizer.json").exists() and (out / folder / "tokenizer_config.json").exists()


def test_e2e_keeps_a_trained_pair(tiny_pair, monkeypatch):
    """A pair already there (its .complete) is not trained again; its measures come back."""
    out, record = tiny_pair
    monkeypatch.setattr(e2e.subprocess, "run", lambda *a, **k: pytest.fail("trained again"))
    assert e2e.train_models(Path(out), [])["held_out"] == record["held_out"]
