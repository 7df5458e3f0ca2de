"""SGLang's own DDTree verify path, built from a patched DDTree branch, around one MLA layer.

Real (from the branch's source, patched by our patch tool): the attention registry's `triton`
creator (so the patched routing), TritonAttnBackend and its metadata / CUDA-graph methods,
ReqToTokenPool, MLATokenToKVPool (bf16 and fp8), DSATokenToKVPool at page size 1 (patch 0007),
ForwardBatch and ForwardMode, RadixAttention, DDTreeVerifyInput and DDTree's own mask compiler (`compile_ddtree_tree`).

Stood in, and why:
- `ModelRunner`: building the real one loads a model and starts distributed groups. The
  backend reads a few attributes of it (pools, configs, device); `runner()` gives exactly those,
  with the real pools and a real transformers config.
- `ServerArgs`: its `__post_init__` resolves a whole server (model files, GPU memory); the
  backend reads the speculative and Triton fields `server_args()` sets.
- the token-to-KV allocator: the backend only asks it for `translate_kv_loc` (absent: identity).
- the distributed groups: one GPU, no tensor parallelism, set through SGLang's own
  `get_parallel().override(...)` (PARALLEL) instead of initialising NCCL groups.
- sgl_kernel (SGLang's compiled CUDA ops) on a GPU machine without a build of it for its torch:
  imported by modules on the way (fp8 quantisation) but not called on the MLA verify path under test;
  torchvision on a CPU machine whose torch has no matching build. Both are inert stand-ins
  (tests/endpoint/standin_gpu_stack.py, STANDIN_GPU_STACK), used only when the real one cannot import.
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import torch

from ddtree_ops import patchtool
from ddtree_ops.ddtree_sources import git_checkout, load_sources

MAX_BS = 8
# One rank of an attention-TP group of 1 (the heads a test gives are the heads of this GPU).
PARALLEL = dict(tp_size=1, tp_rank=0, attn_tp_size=1, attn_tp_rank=0, attn_cp_size=1, attn_cp_rank=0,
                dcp_enabled=False, dcp_size=1, dcp_rank=0, attn_dcp_size=1, attn_dcp_rank=0)


def sglang_source(workdir: Path) -> Path:
    """`python/` of the ddtree-v2 snapshot as a git checkout, patched by our tool (once a session)."""
    explicit = os.environ.get("DDTREE_SGLANG_PYTHON")
    if explicit:
        return Path(explicit)
    source = next(s for s in load_sources() if s.name == "ddtree-v2")
    snapshot = source.snapshot_path()
    if snapshot is None:
        raise FileNotFoundError(f"{source.snapshot} not found: set DDTREE_SGLANG_SNAPSHOTS to the folder holding it")
    repo = workdir / "ddtree-v2"
    git_checkout(snapshot, repo)
    report = patchtool.apply(repo)
    assert report.series == "ddtree-v2", report
    return repo / "python"


def import_sglang(python_dir: Path) -> types.SimpleNamespace:
    """The real SGLang modules the harness uses, imported from `python_dir`."""
    if str(python_dir) not in sys.path:
        sys.path.insert(0, str(python_dir))
    missing = [name for name in ("sgl_kernel", "torchvision") if not _imports(name)]
    if missing:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "endpoint"))
        os.environ["STANDIN_GPU_STACK"] = ",".join(missing)  # read when the module installs itself
        import standin_gpu_stack  # noqa: F401
    import sglang

    assert Path(sglang.__file__).is_relative_to(python_dir), sglang.__file__
    names = {
        "AttentionArch": "sglang.srt.configs.model_config",
        "TritonAttnBackend": "sglang.srt.layers.attention.triton_backend",
        "AttentionType": "sglang.srt.layers.radix_attention",
        "RadixAttention": "sglang.srt.layers.radix_attention",
        "MLATokenToKVPool": "sglang.srt.mem_cache.memory_pool",
        "DSATokenToKVPool": "sglang.srt.mem_cache.memory_pool",
        "ReqToTokenPool": "sglang.srt.mem_cache.memory_pool",
        "ForwardBatch": "sglang.srt.model_executor.forward_batch_info",
        "ForwardMode": "sglang.srt.model_executor.forward_batch_info",
        "get_parallel": "sglang.srt.runtime_context",
        "DDTreeVerifyInput": "sglang.srt.speculative.ddtree_info",
        "compile_ddtree_tree": "sglang.srt.speculative.ddtree_utils",
    }
    found = {name: getattr(importlib.import_module(module), name) for name, module in names.items()}
    found["attention_registry"] = importlib.import_module("sglang.srt.layers.attention.attention_registry")
    return types.SimpleNamespace(**found)


def _imports(name: str) -> bool:
    try:
        __import__(name)
        return True
    except (ImportError, RuntimeError):  # RuntimeError: a torchvision built for another torch
        return False


def server_args(budget: int, block: int = 16) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        speculative_algorithm="DDTREE", speculative_ddtree_budget=budget, speculative_num_draft_tokens=block,
        speculative_num_steps=None, speculative_eagle_topk=None, triton_attention_num_kv_splits=8,
        chunked_prefill_size=8192, enable_deterministic_inference=False, triton_attention_split_tile_size=None,
    )


@dataclass
class Layout:
    heads: int = 8
    kv_dtype: torch.dtype = torch.bfloat16
    pool_tokens: int = 4096
    context_len: int = 4096
    budget: int = 8
    dsa_topk: int | None = None  # a DSA model (GLM-5's architecture, this index_topk): SGLang's DSA pool


def runner(sg, layout: Layout, device: str) -> types.SimpleNamespace:
    """What TritonAttnBackend reads of a ModelRunner, with the real pools behind it."""
    from transformers import PretrainedConfig

    req_pool = sg.ReqToTokenPool(size=MAX_BS, max_context_len=layout.context_len + 128, device=device,
                                 enable_memory_saver=False)
    if layout.dsa_topk is None:
        kv_pool = sg.MLATokenToKVPool(layout.pool_tokens, page_size=1, dtype=layout.kv_dtype, kv_lora_rank=512,
                                      qk_rope_head_dim=64, layer_num=1, device=device, enable_memory_saver=False)
        hf_config = PretrainedConfig(architectures=["DeepseekV3ForCausalLM"])
    else:  # at DDTree's page size 1, which patch 0007 lets the DSA pool take on CUDA
        kv_pool = sg.DSATokenToKVPool(layout.pool_tokens, page_size=1, kv_lora_rank=512, dtype=layout.kv_dtype,
                                      qk_rope_head_dim=64, layer_num=1, device=device, index_head_dim=128,
                                      enable_memory_saver=False, kv_cache_dim=576)
        hf_config = PretrainedConfig(architectures=["GlmMoeDsaForCausalLM"], index_topk=layout.dsa_topk,
                                     index_n_heads=32, index_head_dim=128, num_hidden_layers=1)
    model_config = types.SimpleNamespace(
        attention_arch=sg.AttentionArch.MLA, num_attention_heads=layout.heads, get_num_kv_heads=lambda tp: 1,
        v_head_dim=512, swa_v_head_dim=None, context_len=layout.context_len, is_encoder_decoder=False,
        hf_config=hf_config, linear_attn_registry_result=None)
    return types.SimpleNamespace(
        req_to_token_pool=req_pool, token_to_kv_pool=kv_pool, token_to_kv_pool_allocator=types.SimpleNamespace(),
        sliding_window_size=None, page_size=1, server_args=server_args(layout.budget), model_config=model_config,
        device=device, gpu_id=0, is_draft_worker=False)


def make_backend(sg, run, kernel: str):
    """The backend the patched registry's `triton` creator returns under DDTREE_VERIFY_KERNEL=kernel."""
    saved = os.environ.get("DDTREE_VERIFY_KERNEL")
    os.environ["DDTREE_VERIFY_KERNEL"] = kernel
    try:
        return sg.attention_registry.ATTENTION_BACKENDS["triton"](run)
    finally:
        if saved is None:
            os.environ.pop("DDTREE_VERIFY_KERNEL", None)
        else:
            os.environ["DDTREE_VERIFY_KERNEL"] = saved


def random_parents(n: int, gen: torch.Generator) -> list[int]:
    """A random tree of n nodes in DDTree's order: node 0 the root, each parent before its child."""
    return [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]


def ddtree_verify_input(sg, prefix_lens: list[int], n: int, budget: int, device: str, gen: torch.Generator):
    """A DDTreeVerifyInput whose custom mask DDTree's own compile_ddtree_tree builds from random trees."""
    bs = len(prefix_lens)
    visibility = torch.zeros(bs, n, n, dtype=torch.bool)
    depths = torch.zeros(bs, budget, dtype=torch.int64)
    for b in range(bs):
        parents = random_parents(n, gen)
        for i in range(n):
            j, d = i, 0
            while j >= 0:
                visibility[b, i, j] = True
                j, d = parents[j], d + (parents[j] >= 0)
            if i:
                depths[b, i - 1] = d
    lens = torch.tensor(prefix_lens, dtype=torch.int64)
    ids, positions, mask, _ = sg.compile_ddtree_tree(
        root_token_ids=torch.randint(0, 1000, (bs,), generator=gen).to(device),
        node_token_ids=torch.randint(0, 1000, (bs, budget), generator=gen).to(device),
        node_depths=depths.to(device), visibility=visibility.to(device), start_positions=lens.to(device),
        past_lengths=lens.to(device), tree_budget=budget, actual_tree_sizes=torch.full((bs,), n).to(device),
        device=torch.device(device), past_lens_cpu=prefix_lens, actual_sizes_cpu=[n] * bs, verify_token_num=n)
    spec = sg.DDTreeVerifyInput(draft_token=ids.reshape(-1), positions=positions.reshape(-1), draft_token_num=n,
                                tree_budget=budget, custom_mask=mask)
    return spec, visibility
