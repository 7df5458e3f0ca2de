"""The models the real-server GPU run serves: random weights, GLM-5's per-GPU attention, a local tokenizer.

No checkpoint can be downloaded on the GPU machine, and the shapes that matter for the verify step
are GLM-5's at tensor-parallel 8, so the run makes its own:
- target: GLM-5's own config (`GlmMoeDsaForCausalLM`, DSA fields included) with 8 attention heads
  (64 / TP 8), MLA kv_lora_rank 512 + rope 64, qk_nope 192, v_head 256, q_lora 2048, hidden 6144,
  and the DSA indexer's weights as GLM-5 has them (replicated, not split by TP: 32 heads of 128). Two
  stand-ins (`STAND_INS`):
  - `glm5-weight` (the measured runs' default): GLM-5's 78 layers, each with a dense bf16 MLP whose
    weight bytes equal what one GPU reads of GLM-5's experts for one verify step at TP 8 in NVFP4:
    9 experts (8 routed + 1 shared, the tree's tokens sharing experts: BENCHMARKS' lower case) x 37,748,736
    parameters (gate, up, down: 3 x 6144 x 2048) x 0.5625 bytes (NVFP4: 4 bits + an fp8 scale per 16)
    / 8 GPUs = 23,887,872 bytes = 3 x 6144 x 648 x 2 bytes, so a width of exactly 648. The GPU's work
    a step is then GLM-5's per GPU, a measurement where the small stand-in needs a projection.
  - `small`: 8 layers, every MLP dense at GLM-5's dense width over TP 8 (12288 / 8): the earlier runs'.
  The deploy's dense-MLA view (`ddtree-ops model-view`) is what the dense runs load.
- drafter: a DFlash draft model (`DFlashDraftModel`, Qwen3-style layers: GQA, q/k norms) on the
  target's hidden size, 5 layers, 6 query heads and 1 KV head of 128 (48 / 8 heads at TP 8), block 16,
  reading 5 target layers' hidden states (DFlash's evenly spaced choice; the small stand-in keeps the
  earlier runs' layers).
- tokenizer: a word-level `tokenizers` vocabulary of the target's size with a chat template.

Weights are normal(0, 0.02) as the configs' initializer_range says, norms 1. The end-of-text row of
lm_head is zero, so a greedy answer never stops early and every smoke answer has content.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

VOCAB = 32768
HIDDEN = 6144
EOS_ID, MASK_ID = 0, 1
SPECIAL = ["<|endoftext|>", "<|MASK|>", "<|system|>", "<|user|>", "<|assistant|>", "[UNK]"]
DRAFT_LAYERS, BLOCK = 5, 16
SHARD_BYTES = 4 << 30

# What one GPU reads of GLM-5's experts for one verify step at TP 8 (the glm5-weight stand-in's MLP bytes).
GLM5_LAYERS = 78
GLM5_EXPERT_PARAMS = 3 * HIDDEN * 2048  # gate, up and down of moe_intermediate_size 2048
GLM5_EXPERTS_A_STEP = 9  # 8 routed + 1 shared when the tree's tokens share their experts
NVFP4_BYTES_A_PARAM = 0.5625  # 4-bit values and one fp8 scale per 16
TP = 8


def expert_bytes_per_gpu() -> int:
    """Bytes of GLM-5's experts one GPU reads in one verify step (a layer): 23,887,872."""
    return round(GLM5_EXPERTS_A_STEP * GLM5_EXPERT_PARAMS * NVFP4_BYTES_A_PARAM / TP)


@dataclass(frozen=True)
class StandIn:
    name: str
    layers: int
    mlp_width: int  # the dense MLP's intermediate size
    target_layer_ids: tuple[int, ...]  # the target layers the drafter reads


def dflash_target_layer_ids(num_target_layers: int, num_draft_layers: int = DRAFT_LAYERS) -> tuple[int, ...]:
    """DFlash's evenly spaced choice of target layers (layer 1 to the fourth from last)."""
    start, end = 1, num_target_layers - 3
    return tuple(round(start + i * (end - start) / (num_draft_layers - 1)) for i in range(num_draft_layers))


STAND_INS = {
    # a dense bf16 MLP of 3 x hidden x width x 2 bytes holds exactly expert_bytes_per_gpu(): width 648
    "glm5-weight": StandIn("glm5-weight", GLM5_LAYERS, expert_bytes_per_gpu() // (3 * HIDDEN * 2),
                           dflash_target_layer_ids(GLM5_LAYERS)),
    "small": StandIn("small", 8, 12288 // TP, (1, 2, 3, 5, 6)),
}
DEFAULT_STAND_IN = "glm5-weight"


def target_config(stand_in: str = DEFAULT_STAND_IN) -> dict:
    """GLM-5's config.json (zai-org/GLM-5) at the per-GPU attention width of TP 8, every layer's MLP dense."""
    si = STAND_INS[stand_in]
    return {
        "architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa", "dtype": "bfloat16",
        "vocab_size": VOCAB, "hidden_size": HIDDEN, "num_hidden_layers": si.layers,
        "num_attention_heads": 8, "num_key_value_heads": 8,
        "q_lora_rank": 2048, "kv_lora_rank": 512, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64,
        "v_head_dim": 256, "rope_interleave": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "max_position_embeddings": 202752, "rms_norm_eps": 1e-5, "hidden_act": "silu",
        "intermediate_size": si.mlp_width, "first_k_dense_replace": si.layers, "mlp_layer_types": ["dense"] * si.layers,
        "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
        "n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": True, "moe_layer_freq": 1,
        "scoring_func": "sigmoid", "topk_method": "noaux_tc", "num_nextn_predict_layers": 1,
        "index_topk": 2048, "index_head_dim": 128, "index_n_heads": 32,
        "attention_bias": False, "tie_word_embeddings": False, "initializer_range": 0.02,
        "bos_token_id": EOS_ID, "eos_token_id": EOS_ID, "pad_token_id": EOS_ID,
    }


def drafter_config(stand_in: str = DEFAULT_STAND_IN) -> dict:
    si = STAND_INS[stand_in]
    return {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "dtype": "bfloat16",
        "vocab_size": VOCAB, "hidden_size": HIDDEN, "num_hidden_layers": DRAFT_LAYERS,
        "num_attention_heads": 6, "num_key_value_heads": 1, "head_dim": 128, "intermediate_size": 12288 // 8,
        "max_position_embeddings": 202752, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "hidden_act": "silu",
        "attention_bias": False, "tie_word_embeddings": False, "initializer_range": 0.02,
        "block_size": BLOCK, "num_target_layers": si.layers,
        "dflash_config": {"target_layer_ids": list(si.target_layer_ids), "mask_token": SPECIAL[MASK_ID],
                          "mask_token_id": MASK_ID, "block_size": BLOCK},
        "bos_token_id": EOS_ID, "eos_token_id": EOS_ID,
    }


def drafter_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Parameter names and shapes of a DFlash checkpoint (names as sglang.srt.models.dflash loads them)."""
    h, d = cfg["hidden_size"], cfg["head_dim"]
    q, kv, inter = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d, cfg["intermediate_size"]
    n_target = len(cfg["dflash_config"]["target_layer_ids"])
    shapes = {"fc.weight": (h, n_target * h), "hidden_norm.weight": (h,), "norm.weight": (h,)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        shapes |= {p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
                   p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
                   p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,),
                   p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
                   p + "mlp.down_proj.weight": (h, inter),
                   p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)}
    return shapes


def target_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Parameter names and shapes of GLM-5's checkpoint layout, read off transformers' own model class."""
    from transformers import AutoConfig, AutoModelForCausalLM

    hf = AutoConfig.for_model(**cfg)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf)
    return {name: tuple(p.shape) for name, p in model.state_dict().items()}


def _random(shapes: dict[str, tuple[int, ...]], gen: torch.Generator, device: str) -> dict[str, torch.Tensor]:
    out = {}
    for name, shape in sorted(shapes.items()):
        if name.endswith(".bias"):
            out[name] = torch.zeros(shape, dtype=torch.bfloat16, device=device)
        elif len(shape) == 1:  # norm weights
            out[name] = torch.ones(shape, dtype=torch.bfloat16, device=device)
        else:
            out[name] = (torch.randn(shape, generator=gen, device=device) * 0.02).to(torch.bfloat16)
    return out


def write_model(folder: Path, config: dict, shapes: dict[str, tuple[int, ...]], seed: int, device: str) -> None:
    """Random weights in shards of about 4 GB with their index (a 78-layer stand-in is ~9 GB), then config.json."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator(device=device).manual_seed(seed)
    shards: list[list[str]] = [[]]
    size = 0
    for name in sorted(shapes):
        nbytes = 2 * math.prod(shapes[name])
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    weight_map = {}
    for i, names in enumerate(shards, 1):
        tensors = _random({n: shapes[n] for n in names}, gen, device)
        if "lm_head.weight" in tensors:
            tensors["lm_head.weight"][EOS_ID].zero_()
        file = "model.safetensors" if len(shards) == 1 else f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file({k: v.contiguous().cpu() for k, v in tensors.items()}, str(folder / file), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(names, file)
    if len(shards) > 1:
        total = sum(2 * math.prod(v) for v in shapes.values())
        (folder / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    (folder / "config.json").write_text(json.dumps(config, indent=1))


def write_tokenizer(folder: Path) -> None:
    """A word-level tokenizer of VOCAB entries: the special tokens, then w0, w1, ... (no hub download)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(SPECIAL)}
    vocab |= {f"w{i}": i for i in range(len(SPECIAL), VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.add_special_tokens(SPECIAL)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    write_tokenizer_config(folder)


CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def write_tokenizer_config(folder: Path, template: str = CHAT_TEMPLATE) -> None:
    """tokenizer_config.json (the special tokens, a chat template) and generation_config.json beside a tokenizer."""
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 202752, "chat_template": template,
        "eos_token": SPECIAL[EOS_ID], "pad_token": SPECIAL[EOS_ID], "unk_token": "[UNK]",
        "mask_token": SPECIAL[MASK_ID], "clean_up_tokenization_spaces": False}, indent=1))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": EOS_ID, "do_sample": False}))


def make_models(root: Path, device: str = "cuda", seed: int = 0, stand_in: str = DEFAULT_STAND_IN) -> dict[str, Path]:
    """target/ (GLM-5 layout, with its tokenizer) and drafter/ under root; returns both paths."""
    target, drafter = root / "target", root / "drafter"
    cfg = target_config(stand_in)
    write_model(target, cfg, target_shapes(cfg), seed, device)
    write_tokenizer(target)
    dcfg = drafter_config(stand_in)
    write_model(drafter, dcfg, drafter_shapes(dcfg), seed + 1, device)
    write_tokenizer(drafter)
    return {"target": target, "drafter": drafter}
