"""A trained target in GLM-5's architecture and a DFlash drafter for it, in plain PyTorch (`make train-pair`).

    python -m tests.server_gpu.train_pair --out .gpu/models-trained [--seed 0]

The random stand-ins of models.py accept ~1 token a step; this pair accepts real paths, so the tree's mask, the
moves of several rows and the drafter's context after a long accept run in the server. One seeded command trains
both on one H100/H200 in about 5 minutes (the time guards stop a slower card early and say so):

- target: `GlmMoeDsaForCausalLM` with GLM-5's attention as one GPU holds it at TP 8 (8 heads, MLA latent 512 + rope
  64, qk_nope 192, v_head 256, interleaved RoPE, theta 1e6) and GLM-5's DSA indexer (32 heads of 128, LayerNorm'd
  keys, half-split RoPE on their first 64 dims, relu-gated head sum); what our kernel sees is GLM-5's. The rest is
  small: 6 layers, hidden 768, q LoRA 768, dense SiLU MLPs of 2,048, a byte vocabulary (corpus.py). The forward
  is the checkpoint's math as SGLang computes it; tests/server_gpu/test_train_pair.py holds it to transformers'
  own GlmMoeDsa and to the absorbed MLA SGLang's decode runs.
- data: Python's standard library (corpus.py), 2,048-token windows; 90% of them get a passage of 64-768
  tokens pasted again later in the window (the continuation is a copy; in half of those the passage is random
  printable bytes, which only copying predicts), and half get PoSE position ids (a random
  skip of up to ~196k between two parts of the window), so relative distances up to the server's 185k are seen
  while training at 2k. The indexer learns by KL from the heads' attention (DeepSeek V3.2's dense warm-up), its
  inputs detached, on 256 query rows of 4 windows a step, so served as DSA its top 2,048 are the keys the heads use.
- drafter: `DFlashDraftModel` (Qwen3-style layers, block 16, 3 layers, 6 query heads and 2 KV heads of 128) reading
  the target layers DFlash's rule picks (1..N-3 evenly: 1, 2, 3 of 6); trained as SpecForge's
  `scripts/train_dflash.py` does: random anchors (128 a window), the block [anchor, MASK x 15] attending to the
  target's projected features of the tokens before its anchor and to its own block, cross-entropy on block
  positions 1..15 against the text with weights exp(-(k-1)/7), the target's embedding and LM head frozen. The
  context keys and values are projected from the features without input_layernorm, as SGLang's DFlash worker does.

Held out (never trained on): next-token accuracy of the target on plain text, on the copy prompts and inside random
passages' pastes (also every `--probe-every` target steps while it trains: whether copying has formed), and the
drafter's accepted length as a DFlash chain: the target's own greedy 15 tokens after a prompt against the
drafter's block, 1 + the matching prefix (what SGLang's accept_length counts a verify step).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from . import corpus, models

BLOCK = models.BLOCK  # 16
MAX_POSITION = 196_608  # PoSE positions stay below this (the server's contexts reach 185k plus their output)
LOSS_DECAY = 7.0  # DFlash's weight exp(-(k-1)/7) on block position k


@dataclass(frozen=True)
class Sizes:
    layers: int = 6
    hidden: int = 768
    q_lora: int = 768
    mlp: int = 2048
    draft_layers: int = 3
    draft_heads: int = 6
    draft_kv_heads: int = 2
    draft_head_dim: int = 128
    draft_mlp: int = 2048
    attention: tuple = ()  # CPU tests only: (name, value) overrides of GLM-5's attention dims


@dataclass(frozen=True)
class Schedule:
    seed: int = 0
    seq: int = 2048
    batch: int = 16
    target_steps: int = 1500
    target_lr: float = 1.5e-3
    target_seconds: float = 200.0  # time guard: stop early (and say so) on a slower card
    draft_steps: int = 1500
    draft_lr: float = 1.5e-3
    draft_seconds: float = 100.0
    anchors: int = 128
    warmup: int = 40
    # The share of windows with a passage pasted again later, and of those the share whose passage (source and
    # paste) is random printable bytes: text the model cannot predict but by copying, which is what the serve
    # prompts ask of it. A copy in half the windows left the held-out accuracy inside the repeat no higher than the
    # plain text's: natural passages alone after 561 steps, half of them random after 1,000: no copying learned.
    copies: float = 0.9
    random_copies: float = 0.5
    indexer_rows: int = 256
    indexer_windows: int = 4
    eval_windows: int = 16
    accept_prompts: int = 64
    accept_prompt_len: int = 1024
    # The target's own greedy tokens (this PyTorch forward) after the server's copy prompt at this context: what the
    # served model's tokens are held to (report.py, same_tokens_as_training); 0 skips it.
    greedy_context: int = 8192
    greedy_tokens: int = 40
    # Every this many target steps, the accuracy inside held-out random passages' pastes (random_paste_windows): the
    # one figure that says whether copying has formed (chance is 1/96), logged as training goes; 0 skips it.
    probe_every: int = 100


TINY = (Sizes(layers=5, hidden=64, q_lora=32, mlp=128, draft_layers=2, draft_heads=2, draft_kv_heads=1,
              draft_head_dim=16, draft_mlp=64,
              attention=(("num_attention_heads", 2), ("num_key_value_heads", 2), ("kv_lora_rank", 32),
                         ("qk_rope_head_dim", 8), ("qk_nope_head_dim", 16), ("v_head_dim", 16),
                         ("index_n_heads", 4), ("index_head_dim", 16))),
        Schedule(seq=64, batch=4, target_steps=30, target_lr=3e-3, draft_steps=20, draft_lr=3e-3, anchors=3,
                 warmup=4, indexer_rows=16, indexer_windows=2, eval_windows=2, accept_prompts=4,
                 accept_prompt_len=48, greedy_context=0, probe_every=10))


# --- configs (what SGLang reads) -------------------------------------------------------------------

def target_layer_ids(sizes: Sizes) -> tuple[int, ...]:
    ids = models.dflash_target_layer_ids(sizes.layers, sizes.draft_layers)
    if len(set(ids)) != len(ids) or max(ids) >= sizes.layers - 1:
        # SGLang captures layer l's output at layer l+1's input: the last layer's is never captured
        raise ValueError(f"{sizes.layers} target layers give DFlash's rule no {sizes.draft_layers} distinct "
                         f"capturable layers: {ids}")
    return ids


def target_config(sizes: Sizes) -> dict:
    """GLM-5's config (models.target_config) with this pair's small sizes and byte vocabulary."""
    cfg = models.target_config("small") | {
        "vocab_size": corpus.VOCAB, "hidden_size": sizes.hidden, "num_hidden_layers": sizes.layers,
        "q_lora_rank": sizes.q_lora, "intermediate_size": sizes.mlp, "first_k_dense_replace": sizes.layers,
        "mlp_layer_types": ["dense"] * sizes.layers}
    return cfg | dict(sizes.attention)


def drafter_config(sizes: Sizes) -> dict:
    ids = list(target_layer_ids(sizes))
    cfg = models.drafter_config("small") | {
        "vocab_size": corpus.VOCAB, "hidden_size": sizes.hidden, "num_hidden_layers": sizes.draft_layers,
        "num_attention_heads": sizes.draft_heads, "num_key_value_heads": sizes.draft_kv_heads,
        "head_dim": sizes.draft_head_dim, "intermediate_size": sizes.draft_mlp, "num_target_layers": sizes.layers}
    cfg["dflash_config"] = cfg["dflash_config"] | {"target_layer_ids": ids}
    return cfg


# --- the target -----------------------------------------------------------------------------------

def _wide(x: torch.Tensor) -> torch.Tensor:
    """float32 for 16-bit inputs (what SGLang's norms and rotary compute in); float64 stays (the CPU tests)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = _wide(x)
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * _wide(self.weight)).to(x.dtype)


def rope_tables(positions: torch.Tensor, dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [..., dim/2] in float32, the inverse frequencies computed as SGLang's rotary cache computes them."""
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float, device=positions.device) / dim))
    ang = positions.float()[..., None] * inv
    return ang.cos(), ang.sin()


def rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Pairs (x0, x1), (x2, x3), ... rotated in place (GLM-5's MLA: rope_interleave, SGLang's non-neox)."""
    xf = _wide(x)
    x1, x2 = xf[..., 0::2], xf[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).flatten(-2).to(x.dtype)


def rope_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Halves (x[:d/2], x[d/2:]) rotated (neox style: the DSA indexer's and the Qwen3 drafter's)."""
    xf = _wide(x)
    x1, x2 = xf.chunk(2, -1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).to(x.dtype)


class Indexer(nn.Module):
    """GLM-5's DSA lightning indexer: score(s, t) = sum_h w_h(s) relu(q_h(s) . k(t)), w scaled by
    heads^-1/2 dim^-1/2 (SGLang folds the softmax scale into the weights; the Hadamard rotation and fp8 keys
    it serves with keep the dot products up to rounding)."""

    def __init__(self, cfg: dict):
        super().__init__()
        self.heads, self.dim, self.rope = cfg["index_n_heads"], cfg["index_head_dim"], cfg["qk_rope_head_dim"]
        self.wq_b = nn.Linear(cfg["q_lora_rank"], self.heads * self.dim, bias=False)
        self.wk = nn.Linear(cfg["hidden_size"], self.dim, bias=False)
        self.k_norm = nn.LayerNorm(self.dim, eps=1e-6)
        self.weights_proj = nn.Linear(cfg["hidden_size"], self.heads, bias=False)

    def scores(self, x: torch.Tensor, q_lora: torch.Tensor, rows: torch.Tensor, cos: torch.Tensor,
               sin: torch.Tensor) -> torch.Tensor:
        """[B, R, T] index scores of query rows `rows` against every key (before any causal mask)."""
        b, r = x.shape[0], rows.numel()
        q = self.wq_b(q_lora[:, rows]).view(b, r, self.heads, self.dim)
        q = torch.cat([rope_half(q[..., :self.rope], cos[:, rows, None], sin[:, rows, None]), q[..., self.rope:]], -1)
        k = self.k_norm(self.wk(x))
        k = torch.cat([rope_half(k[..., :self.rope], cos, sin), k[..., self.rope:]], -1)
        w = self.weights_proj(x[:, rows]).float() * (self.heads ** -0.5) * (self.dim ** -0.5)
        s = torch.relu(torch.einsum("brhd,btd->brht", q.float(), k.float()))
        return torch.einsum("brh,brht->brt", w, s)


class MLA(nn.Module):
    """GLM-5's multi-head latent attention, unabsorbed (SGLang's prefill form; its decode absorbs kv_b_proj into
    the query and the output, the same function: the test holds the two equal)."""

    def __init__(self, cfg: dict):
        super().__init__()
        self.h, self.nope, self.rope = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"]
        self.v, self.lora = cfg["v_head_dim"], cfg["kv_lora_rank"]
        eps = cfg["rms_norm_eps"]
        self.q_a_proj = nn.Linear(cfg["hidden_size"], cfg["q_lora_rank"], bias=False)
        self.q_a_layernorm = RMSNorm(cfg["q_lora_rank"], eps)
        self.q_b_proj = nn.Linear(cfg["q_lora_rank"], self.h * (self.nope + self.rope), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(cfg["hidden_size"], self.lora + self.rope, bias=False)
        self.kv_a_layernorm = RMSNorm(self.lora, eps)
        self.kv_b_proj = nn.Linear(self.lora, self.h * (self.nope + self.v), bias=False)
        self.o_proj = nn.Linear(self.h * self.v, cfg["hidden_size"], bias=False)
        self.indexer = Indexer(cfg)
        self.scale = (self.nope + self.rope) ** -0.5

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                indexer_rows: tuple[int, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        b, t, _ = x.shape
        q_lora = self.q_a_layernorm(self.q_a_proj(x))
        q_nope, q_pe = self.q_b_proj(q_lora).view(b, t, self.h, -1).split([self.nope, self.rope], -1)
        c, k_pe = self.kv_a_proj_with_mqa(x).split([self.lora, self.rope], -1)
        k_nope, v = self.kv_b_proj(self.kv_a_layernorm(c)).view(b, t, self.h, -1).split([self.nope, self.v], -1)
        q_pe = rope_interleaved(q_pe, cos[:, :, None], sin[:, :, None])
        k_pe = rope_interleaved(k_pe[:, :, None], cos[:, :, None], sin[:, :, None])
        q = torch.cat([q_nope, q_pe], -1).transpose(1, 2)
        k = torch.cat([k_nope, k_pe.expand(-1, -1, self.h, -1)], -1).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v.transpose(1, 2), is_causal=True, scale=self.scale)
        out = self.o_proj(o.transpose(1, 2).reshape(b, t, -1))
        loss = None
        if indexer_rows is not None:
            loss = self.indexer_loss(x, q_lora, q, k, cos, sin, *indexer_rows)
        return out, loss

    def indexer_loss(self, x, q_lora, q, k, cos, sin, windows: int, rows: torch.Tensor) -> torch.Tensor:
        """KL(heads' mean attention || softmax(index scores)) over the causal keys of `rows`; only the indexer
        learns from it."""
        x, q_lora = x[:windows].detach(), q_lora[:windows].detach()
        causal = torch.arange(x.shape[1], device=x.device)[None, :] <= rows[:, None]  # [R, T]
        with torch.no_grad():
            logits = torch.einsum("bhrd,bhtd->bhrt", q[:windows, :, rows].float(), k[:windows].float()) * self.scale
            p = logits.masked_fill(~causal, float("-inf")).softmax(-1).mean(1)  # [W, R, T]
        logq = self.indexer.scores(x, q_lora, rows, cos[:windows], sin[:windows])
        logq = logq.masked_fill(~causal, float("-inf")).log_softmax(-1)
        kl = torch.where(causal & (p > 0), p * (p.clamp_min(1e-30).log() - logq), torch.zeros_like(p))
        return kl.sum(-1).mean()


class MLP(nn.Module):
    def __init__(self, hidden: int, width: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, width, bias=False)
        self.up_proj = nn.Linear(hidden, width, bias=False)
        self.down_proj = nn.Linear(width, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class TargetLayer(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.self_attn = MLA(cfg)
        self.post_attention_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.mlp = MLP(cfg["hidden_size"], cfg["intermediate_size"])

    def forward(self, x, cos, sin, indexer_rows=None):
        a, loss = self.self_attn(self.input_layernorm(x), cos, sin, indexer_rows)
        x = x + a
        return x + self.mlp(self.post_attention_layernorm(x)), loss


class Target(nn.Module):
    """Parameter names are the checkpoint's (models.target_shapes, from transformers' own class)."""

    def __init__(self, cfg: dict):
        super().__init__()
        self.cfg = cfg
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.model.layers = nn.ModuleList(TargetLayer(cfg) for _ in range(cfg["num_hidden_layers"]))
        self.model.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, capture: tuple[int, ...] = (),
                upto: int | None = None, indexer_rows=None):
        """(logits or None when stopped at `upto` layers, [output of each layer in `capture`], indexer loss)."""
        cos, sin = rope_tables(positions, self.cfg["qk_rope_head_dim"], self.cfg["rope_parameters"]["rope_theta"])
        x = self.model.embed_tokens(ids)
        captured, losses = [], []
        layers = self.model.layers if upto is None else self.model.layers[:upto]
        for i, layer in enumerate(layers):
            x, loss = layer(x, cos, sin, indexer_rows)
            if loss is not None:
                losses.append(loss)
            if i in capture:
                captured.append(x)
        logits = None if upto is not None else self.lm_head(self.model.norm(x))
        return logits, captured, (sum(losses) / len(losses) if losses else None)


# --- the drafter ----------------------------------------------------------------------------------

class DraftAttention(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        h, self.heads, self.kv, self.d = (cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
                                          cfg["head_dim"])
        self.q_proj = nn.Linear(h, self.heads * self.d, bias=False)
        self.k_proj = nn.Linear(h, self.kv * self.d, bias=False)
        self.v_proj = nn.Linear(h, self.kv * self.d, bias=False)
        self.o_proj = nn.Linear(self.heads * self.d, h, bias=False)
        self.q_norm = RMSNorm(self.d, cfg["rms_norm_eps"])
        self.k_norm = RMSNorm(self.d, cfg["rms_norm_eps"])

    def forward(self, x, ctx, block_rope, ctx_rope, mask):
        b, n, _ = x.shape
        t = ctx.shape[1]
        q = rope_half(self.q_norm(self.q_proj(x).view(b, n, self.heads, self.d)), *block_rope)
        k_blk = rope_half(self.k_norm(self.k_proj(x).view(b, n, self.kv, self.d)), *block_rope)
        k_ctx = rope_half(self.k_norm(self.k_proj(ctx).view(b, t, self.kv, self.d)), *ctx_rope)
        k = torch.cat([k_ctx, k_blk], 1).transpose(1, 2)
        v = torch.cat([self.v_proj(ctx).view(b, t, self.kv, self.d), self.v_proj(x).view(b, n, self.kv, self.d)],
                      1).transpose(1, 2)
        rep = self.heads // self.kv
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k, v.to(q.dtype), attn_mask=mask, scale=self.d ** -0.5)
        return self.o_proj(o.transpose(1, 2).reshape(b, n, -1))


class DraftLayer(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.self_attn = DraftAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.mlp = MLP(cfg["hidden_size"], cfg["intermediate_size"])

    def forward(self, x, ctx, block_rope, ctx_rope, mask):
        x = x + self.self_attn(self.input_layernorm(x), ctx, block_rope, ctx_rope, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Drafter(nn.Module):
    """SGLang's DFlashDraftModel: no embedding or LM head (the target's); `fc` + `hidden_norm` project the
    concatenated target features, which every layer's k_proj/v_proj read as extra keys and values."""

    def __init__(self, cfg: dict):
        super().__init__()
        self.cfg = cfg
        h = cfg["hidden_size"]
        n_feat = len(cfg["dflash_config"]["target_layer_ids"])
        self.layers = nn.ModuleList(DraftLayer(cfg) for _ in range(cfg["num_hidden_layers"]))
        self.fc = nn.Linear(n_feat * h, h, bias=False)
        self.hidden_norm = RMSNorm(h, cfg["rms_norm_eps"])
        self.norm = RMSNorm(h, cfg["rms_norm_eps"])

    def forward(self, features, ctx_pos, block_emb, block_pos, mask):
        """features [B, T, K*hidden], block_emb [B, N*16, hidden], mask [B, 1, N*16, T + N*16] (True: attend)."""
        ctx = self.hidden_norm(self.fc(features))
        theta = self.cfg["rope_theta"]
        ctx_rope = tuple(a[:, :, None] for a in rope_tables(ctx_pos, self.cfg["head_dim"], theta))
        block_rope = tuple(a[:, :, None] for a in rope_tables(block_pos, self.cfg["head_dim"], theta))
        x = block_emb
        for layer in self.layers:
            x = layer(x, ctx, block_rope, ctx_rope, mask)
        return self.norm(x)


def draft_mask(anchors: torch.Tensor, t: int) -> torch.Tensor:
    """[B, 1, N*16, T + N*16]: a block sees the context before its anchor and its own 16 positions (both ways)."""
    b, n = anchors.shape
    q_block = torch.arange(n * BLOCK, device=anchors.device) // BLOCK
    ctx = torch.arange(t, device=anchors.device)[None, None, :] < anchors[:, q_block][..., None]
    own = (q_block[:, None] == q_block[None, :]).expand(b, -1, -1)
    return torch.cat([ctx, own], -1)[:, None]


def draft_block(target: Target, ids: torch.Tensor, positions: torch.Tensor, anchors: torch.Tensor):
    """The blocks [anchor token, MASK x 15], their embeddings (the target's) and positions (anchor's + k)."""
    b, n = anchors.shape
    block_ids = torch.full((b, n, BLOCK), corpus.MASK_ID, dtype=torch.long, device=ids.device)
    block_ids[:, :, 0] = ids.gather(1, anchors)
    offsets = torch.arange(BLOCK, device=ids.device)
    block_pos = (positions.gather(1, anchors)[..., None] + offsets).reshape(b, -1)
    return target.model.embed_tokens(block_ids.reshape(b, -1)), block_pos


# --- data -----------------------------------------------------------------------------------------

# Random copies' alphabet: printable ASCII and the newline, as byte-vocabulary ids.
PRINTABLE = torch.tensor([10, *range(32, 127)]) + corpus.BYTE_OFFSET


class Batches:
    """Seeded windows of the training text on the device: copies pasted in a `copies` share (a `random_copies` share
    of them of random bytes), PoSE skips in half."""

    def __init__(self, tokens: torch.Tensor, sched: Schedule, device: str):
        self.tokens, self.s, self.device = tokens, sched, device
        self.gen = torch.Generator(device=device).manual_seed(sched.seed)
        # the random passages draw from a generator of their own: with random_copies=0 the windows are those of a
        # schedule without them, batch after batch
        self.gen_copies = torch.Generator(device=device).manual_seed(sched.seed + 1)
        self.printable = PRINTABLE.to(device)

    def _rand(self, n: int, low, high) -> torch.Tensor:
        u = torch.rand(n, generator=self.gen, device=self.device)
        return (low + u * (high - low)).long()

    def __call__(self) -> tuple[torch.Tensor, torch.Tensor]:
        b, t = self.s.batch, self.s.seq
        starts = self._rand(b, 0, len(self.tokens) - t - 1)
        i = torch.arange(t, device=self.device)
        # a copy: [s, s+p) pasted at d >= s+p (p = 0: none)
        p = self._rand(b, max(2, t // 32), max(3, 3 * t // 8)) * (torch.rand(b, generator=self.gen, device=self.device)
                                                                   < self.s.copies)
        s = (torch.rand(b, generator=self.gen, device=self.device) * (t // 2 - p).clamp_min(1)).long()
        d = s + p + (torch.rand(b, generator=self.gen, device=self.device) * (t - 2 * p - s).clamp_min(1)).long()
        inside = (i[None] >= d[:, None]) & (i[None] < (d + p)[:, None])
        at = torch.where(inside, s[:, None] + i[None] - d[:, None], i[None])  # the window position each one reads
        ids = self.tokens[starts[:, None] + at]
        # random passages: the source's positions get random bytes, the paste the same ones
        rand = (torch.rand(b, generator=self.gen_copies, device=self.device) < self.s.random_copies) & (p > 0)
        noise = torch.randint(0, len(PRINTABLE), (b, t), generator=self.gen_copies, device=self.device)
        in_source = (i[None] >= s[:, None]) & (i[None] < (s + p)[:, None])
        ids = torch.where(rand[:, None] & (inside | in_source), self.printable[noise.gather(1, at)], ids)
        # PoSE: positions jump by `skip` at `cut` (between a copy's source and its paste where there is one)
        cut = torch.where(p > 0, s + p + (torch.rand(b, generator=self.gen, device=self.device)
                                          * (d - s - p + 1).float()).long(), self._rand(b, 1, t))
        skip = self._rand(b, 0, MAX_POSITION - t) * (torch.rand(b, generator=self.gen, device=self.device) < 0.5)
        positions = i[None] + skip[:, None] * (i[None] >= cut[:, None])
        return ids, positions


def token_tensor(data: bytes) -> torch.Tensor:
    """corpus.encode as a tensor: id = BYTE_OFFSET + byte."""
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long() + corpus.BYTE_OFFSET


def held_out_windows(tokens: torch.Tensor, n: int, t: int, device: str) -> torch.Tensor:
    step = max(1, (len(tokens) - t) // n)
    return torch.stack([tokens[k * step: k * step + t] for k in range(n)]).to(device)


def random_paste_windows(held: torch.Tensor, n: int, t: int, device: str) -> tuple[torch.Tensor, slice]:
    """Held-out windows with a passage of random printable bytes (its own seeded draw) at t/8 and again at t/2, each
    t/4 long, and the positions whose next token lies inside the paste after its first byte: only a model that
    copies predicts them."""
    windows = held_out_windows(held, n, t, device).clone()
    p, s, d = max(2, t // 4), t // 8, t // 2
    gen = torch.Generator().manual_seed(1234)
    passage = PRINTABLE[torch.randint(0, len(PRINTABLE), (n, p), generator=gen)].to(device)
    windows[:, s:s + p] = passage
    windows[:, d:d + p] = passage
    return windows, slice(d, d + p - 1)  # logits at d..d+p-2 predict the paste's bytes 1..p-1


def copy_windows(n: int, t: int, device: str) -> torch.Tensor:
    """The server prompts' structure at a short length: filler, passage, the passage again (corpus.copy_prompt)."""
    source = corpus.text("held-out")
    passage, repeat = max(8, t * 3 // 8), max(4, t // 16)
    out = []
    for k in range(n):
        offset_source = source[(k * 7919) % len(source):] + source
        out.append(corpus.copy_prompt(offset_source, t, passage, repeat))
    return torch.tensor(out, device=device)


# --- training -------------------------------------------------------------------------------------

def init_weights(module: nn.Module, layers: int) -> None:
    for name, p in module.named_parameters():
        if p.ndim == 1:
            nn.init.ones_(p) if name.endswith("weight") else nn.init.zeros_(p)
        else:
            std = 0.02 / math.sqrt(2 * layers) if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
            nn.init.normal_(p, std=std)


def optimizer(module: nn.Module, lr: float) -> torch.optim.Optimizer:
    decay = [p for p in module.parameters() if p.requires_grad and p.ndim >= 2]
    rest = [p for p in module.parameters() if p.requires_grad and p.ndim < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95))


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup))))


def _progress(total: int, desc: str):
    try:
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, unit="step", mininterval=5, ascii=True)
    except ImportError:  # a bare image: a line every 50 steps instead
        class Lines:
            n = 0

            def update(self, k: int = 1):
                self.n += k

            def set_postfix(self, **kw):
                if self.n % 50 == 0:
                    print(f"{desc} {self.n}/{total} {kw}", flush=True)

            def close(self):
                pass

        return Lines()


def _autocast(device: str):
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.startswith("cuda") else torch.autocast(
        "cpu", enabled=False)


def _loop(name: str, module: nn.Module, steps: int, peak_lr: float, seconds: float, sched: Schedule,
          step_fn, device: str, probe=None) -> dict:
    """AdamW with warm-up and cosine decay over `steps`; step_fn() -> (loss to minimise, second figure) under
    autocast. A line of progress, the losses every 10 steps, and the time guard checked there; probe() -> a figure,
    every sched.probe_every steps and after the last, printed and recorded as `probe` (step, figure)."""
    opt = optimizer(module, peak_lr)
    bar = _progress(steps, name)
    t0, losses, done, probed = time.monotonic(), [], 0, []

    def run_probe(step: int) -> None:
        module.eval()
        probed.append((step, probe()))
        module.train()
        print(f"{name} step {step}: probe {probed[-1][1]:.3f}", flush=True)

    for step in range(steps):
        if probe is not None and sched.probe_every and step % sched.probe_every == 0:
            run_probe(step)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, peak_lr, sched.warmup)
        with _autocast(device):
            loss, other = step_fn()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        opt.step()
        done = step + 1
        bar.update(1)
        if step % 10 == 0 or done == steps:
            losses.append((step, loss.item(), other.item()))
            elapsed = time.monotonic() - t0
            bar.set_postfix(loss=f"{losses[-1][1]:.3f}", other=f"{losses[-1][2]:.3f}",
                            tok_s=f"{done * sched.batch * sched.seq / elapsed:,.0f}")
            if elapsed > seconds and done < steps:
                print(f"{name}: the time guard ({seconds:.0f} s) stopped training at step {done} of {steps}",
                      flush=True)
                break
    bar.close()
    if probe is not None and sched.probe_every:
        run_probe(done)
    record = {"steps": done, "of_steps": steps, "seconds": round(time.monotonic() - t0, 1),
              "tokens": done * sched.batch * sched.seq, "loss": losses}
    return record | ({"probe": probed} if probed else {})


def train_target(target: Target, batches: Batches, sched: Schedule, device: str,
                 pastes: tuple[torch.Tensor, slice] | None = None) -> dict:
    """Next-token cross-entropy, plus the indexer's KL (its own parameters only); `other` is the KL. `pastes`
    (random_paste_windows): the probe, recorded as `copy_accuracy` (step, accuracy inside the pastes)."""
    rows = torch.arange(sched.seq - sched.indexer_rows, sched.seq - 1, device=device)

    def step():
        ids, positions = batches()
        logits, _, idx_loss = target(ids[:, :-1], positions[:, :-1], indexer_rows=(sched.indexer_windows, rows))
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        return loss + idx_loss, idx_loss

    probe = None
    if pastes is not None:
        def probe() -> float:
            return next_token_accuracy(target, pastes[0], device, positions=pastes[1])
    record = _loop("target", target, sched.target_steps, sched.target_lr, sched.target_seconds, sched, step, device,
                   probe)
    record["loss"] = [(k, total - kl, kl) for k, total, kl in record["loss"]]  # (step, cross-entropy, indexer KL)
    if "probe" in record:
        record["copy_accuracy"] = record.pop("probe")
    return record


def draft_loss(target: Target, drafter: Drafter, ids: torch.Tensor, positions: torch.Tensor,
               anchors: torch.Tensor, layer_ids: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        _, feats, _ = target(ids, positions, capture=layer_ids, upto=max(layer_ids) + 1)
        block_emb, block_pos = draft_block(target, ids, positions, anchors)
    out = drafter(torch.cat(feats, -1), positions, block_emb, block_pos, draft_mask(anchors, ids.shape[1]))
    logits = target.lm_head(out).float()
    k = torch.arange(BLOCK, device=ids.device)
    labels = ids.gather(1, (anchors[..., None] + k).reshape(anchors.shape[0], -1).clamp(max=ids.shape[1] - 1))
    weight = (torch.exp(-(k - 1).clamp_min(0) / LOSS_DECAY) * (k > 0)).repeat(anchors.shape[1])
    weight = weight[None] * ((anchors[..., None] + k) < ids.shape[1]).reshape(anchors.shape[0], -1)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
    loss = (ce * weight.reshape(-1)).sum() / weight.sum()
    acc = ((logits.argmax(-1) == labels).float() * (weight > 0)).sum() / (weight > 0).sum()
    return loss, acc


def sample_anchors(gen: torch.Generator, b: int, t: int, n: int, device: str) -> torch.Tensor:
    """n distinct anchors a window in [1, T-16] (every label inside the window), sorted."""
    order = torch.rand(b, t - BLOCK, generator=gen, device=device).argsort(-1)[:, :n] + 1
    return order.sort(-1).values


def train_drafter(target: Target, drafter: Drafter, batches: Batches, sched: Schedule, device: str,
                  layer_ids: tuple[int, ...]) -> dict:
    """DFlash's block cross-entropy; `other` is the block positions' top-1 accuracy."""

    def step():
        ids, positions = batches()
        anchors = sample_anchors(batches.gen, sched.batch, sched.seq, sched.anchors, device)
        return draft_loss(target, drafter, ids, positions, anchors, layer_ids)

    return _loop("drafter", drafter, sched.draft_steps, sched.draft_lr, sched.draft_seconds, sched, step, device)


# --- held-out measures ----------------------------------------------------------------------------

@torch.no_grad()
def next_token_accuracy(target: Target, windows: torch.Tensor, device: str, from_position: int = 0,
                        positions: slice | None = None) -> float:
    """Greedy next-token accuracy over `positions` of the logits (default: from `from_position` on)."""
    positions = positions or slice(from_position, None)
    accs = []
    for w in windows.split(4):
        pos = torch.arange(w.shape[1], device=device).expand(w.shape[0], -1)
        with _autocast(device):
            logits, _, _ = target(w[:, :-1], pos[:, :-1])
        accs.append((logits.argmax(-1) == w[:, 1:])[:, positions].float().mean().item())
    return sum(accs) / len(accs)


@torch.no_grad()
def greedy(target: Target, prompts: torch.Tensor, n: int, device: str) -> torch.Tensor:
    seq = prompts
    for _ in range(n):
        pos = torch.arange(seq.shape[1], device=device).expand(seq.shape[0], -1)
        with _autocast(device):
            logits, _, _ = target(seq, pos)
        seq = torch.cat([seq, logits[:, -1].argmax(-1, keepdim=True)], 1)
    return seq[:, prompts.shape[1]:]


@torch.no_grad()
def chain_accept_length(target: Target, drafter: Drafter, prompts: torch.Tensor, device: str,
                        layer_ids: tuple[int, ...]) -> float:
    """Mean tokens a DFlash chain step would take: the anchor (the prompt's last token, whose context is every
    token before it) and 15 drafted tokens against the target's own greedy 15; 1 + the matching prefix."""
    n, t = prompts.shape
    truth = greedy(target, prompts, BLOCK - 1, device)
    anchors = torch.full((n, 1), t - 1, device=device)
    pos = torch.arange(t, device=device).expand(n, -1)
    with _autocast(device):
        _, feats, _ = target(prompts, pos, capture=layer_ids, upto=max(layer_ids) + 1)
        block_emb, block_pos = draft_block(target, prompts, pos, anchors)
        out = drafter(torch.cat(feats, -1), pos, block_emb, block_pos, draft_mask(anchors, t))
        drafted = target.lm_head(out)[:, 1:].argmax(-1)
    match = (drafted == truth).long().cumprod(-1).sum(-1)
    return 1.0 + match.float().mean().item()


# --- saving ---------------------------------------------------------------------------------------

def save(folder: Path, module: nn.Module, config: dict, skip: tuple[str, ...] = ()) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in module.state_dict().items()
               if not k.startswith(skip)}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    corpus.write_tokenizer(folder)


def train(out: Path, sizes: Sizes = Sizes(), sched: Schedule = Schedule(), device: str = "cuda") -> dict:
    """Train the pair into out/target and out/drafter; out/train.json holds what was measured; out/.complete last."""
    t0 = time.monotonic()
    torch.manual_seed(sched.seed)
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    train_tokens = token_tensor(corpus.text("train")).to(device)
    held = token_tensor(corpus.text("held-out"))
    print(f"text: {len(train_tokens):,} training tokens, {len(held):,} held out (Python {corpus.stdlib_root()})",
          flush=True)
    cfg, dcfg = target_config(sizes), drafter_config(sizes)
    layer_ids = target_layer_ids(sizes)
    target, drafter = Target(cfg).to(device), Drafter(dcfg).to(device)
    init_weights(target, sizes.layers)
    init_weights(drafter, sizes.draft_layers)
    n_target = sum(p.numel() for p in target.parameters())
    n_draft = sum(p.numel() for p in drafter.parameters())
    print(f"target {n_target / 1e6:.1f} M parameters, drafter {n_draft / 1e6:.1f} M; drafter reads layers "
          f"{layer_ids}", flush=True)
    batches = Batches(train_tokens, sched, device)
    record: dict = {"sizes": asdict(sizes), "schedule": asdict(sched), "device": device,
                    "target_parameters": n_target, "drafter_parameters": n_draft, "target_layer_ids": list(layer_ids)}
    if device.startswith("cuda"):
        record["gpu"] = torch.cuda.get_device_name(0)
    pastes = random_paste_windows(held, sched.eval_windows, sched.seq, device)
    record["target"] = train_target(target, batches, sched, device, pastes)
    target.eval().requires_grad_(False)
    record["drafter"] = train_drafter(target, drafter, batches, sched, device, layer_ids)
    drafter.eval()
    plain = held_out_windows(held, sched.eval_windows, sched.seq, device)
    copies = copy_windows(sched.eval_windows, sched.seq, device)
    copy_from = sched.seq - max(4, sched.seq // 16)  # the repeat: predicting it is copying
    plain_prompts = held_out_windows(held[len(held) // 2:], sched.accept_prompts, sched.accept_prompt_len, device)
    copy_prompts = copy_windows(sched.accept_prompts, sched.accept_prompt_len, device)
    record["held_out"] = {
        "next_token_accuracy_plain": next_token_accuracy(target, plain, device),
        "next_token_accuracy_copy_prompts": next_token_accuracy(target, copies, device),
        "next_token_accuracy_in_the_repeat": next_token_accuracy(target, copies, device, copy_from),
        "next_token_accuracy_in_random_pastes": next_token_accuracy(target, pastes[0], device, positions=pastes[1]),
        "chain_accept_length_plain": chain_accept_length(target, drafter, plain_prompts, device, layer_ids),
        "chain_accept_length_copy_prompts": chain_accept_length(target, drafter, copy_prompts, device, layer_ids),
    }
    for k, v in record["held_out"].items():
        print(f"held out: {k} {v:.3f}", flush=True)
    if sched.greedy_context:
        prompt = torch.tensor([corpus.serve_prompt(sched.greedy_context)], device=device)
        tokens = greedy(target, prompt, sched.greedy_tokens, device)[0].tolist()
        record["greedy_after_serve_prompt"] = {str(sched.greedy_context): tokens}
        print(f"greedy after the {sched.greedy_context}-token serve prompt: {corpus.decode(tokens)!r}", flush=True)
    save(out / "target", target, cfg)
    save(out / "drafter", drafter, dcfg)
    record["seconds"] = round(time.monotonic() - t0, 1)
    (out / "train.json").write_text(json.dumps(record, indent=1))
    (out / ".complete").touch()
    print(f"the pair is in {out} ({record['seconds']:.0f} s)", flush=True)
    return record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[2] / ".gpu" / "models-trained")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="the CPU tests' sizes (minutes become seconds; no use served)")
    for field, value in asdict(Schedule()).items():
        ap.add_argument(f"--{field.replace('_', '-')}", type=type(value), default=None)
    args = ap.parse_args(argv)
    sizes, sched = TINY if args.tiny else (Sizes(), Schedule())
    chosen = {f: getattr(args, f) for f in asdict(sched) if getattr(args, f) is not None}
    sched = Schedule(**(asdict(sched) | chosen))
    (args.out / ".complete").unlink(missing_ok=True)
    train(args.out, sizes, sched, args.device)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
