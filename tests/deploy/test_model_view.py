"""The dense-MLA view of GLM-5 (ddtree-ops model-view) and the launch check's DSA decision, as SGLang sees them.

GLM-5's config (the published field set, at the test server's per-GPU sizes: tests/server_gpu/models.py)
is loaded with the DDTree branch's transformers (5.12.1), and SGLang's own `is_deepseek_dsa` is run from
the ddtree-v2 snapshot's source. The first real server run found that a config.json without index_topk
still loads as DSA (GlmMoeDsaConfig's default is 2048): the first test keeps that fact in view.
"""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path

import pytest
from transformers import AutoConfig

from ddtree_ops.cli import main as cli
from ddtree_ops.ddtree_sources import load_sources
from ddtree_ops.launch_check import dsa_problem, is_deepseek_dsa
from ddtree_ops.model_view import ModelViewError, make_view
from ddtree_ops.series import load_series
from tests.server_gpu.models import target_config

# What the launch check reads of SGLang: its DSA test, and the files patch 0007 changes.
DSA_FILES = ["__init__.py", "srt/configs/model_config.py", "srt/arg_groups/overrides.py",
             "srt/mem_cache/memory_pool.py", "srt/layers/attention/dsa/dsa_indexer.py",
             "kernels/ops/attention/dsa/index_buf_accessor.py",
             "srt/models/deepseek_common/attention_backend_handler.py"]


def _branch_files(dest: Path) -> Path:
    """Those files of the pinned DDTree branch (its snapshot) under dest/sglang/."""
    source = next(s for s in load_sources() if s.name == "ddtree-v2")
    with tarfile.open(source.snapshot_path()) as tf:
        for name in DSA_FILES:
            member = next(m for m in tf.getmembers() if m.name.endswith(f"python/sglang/{name}"))
            (dest / "sglang" / name).parent.mkdir(parents=True, exist_ok=True)
            (dest / "sglang" / name).write_bytes(tf.extractfile(member).read())
    return dest / "sglang"


@pytest.fixture(scope="module")
def sglang_dir(tmp_path_factory):
    return _branch_files(tmp_path_factory.mktemp("sglang"))


@pytest.fixture(scope="module")
def patched_sglang_dir(tmp_path_factory):
    """The same files with patch 0007 applied (what a DDTree release's venv holds)."""
    package = _branch_files(tmp_path_factory.mktemp("patched"))
    series = next(s for s in load_series() if s.name == "ddtree-v2")
    patch = next(p for p in series.patches if p.name.startswith("0007"))
    subprocess.run(["git", "apply", str(patch.path)], cwd=package.parent, check=True)
    return package


@pytest.fixture
def glm5(tmp_path):
    folder = tmp_path / "GLM-5"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(target_config()))
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "tokenizer.json").write_text("{}")
    return folder


def test_deleting_index_topk_does_not_make_glm5_dense(glm5, sglang_dir):
    config = {k: v for k, v in target_config().items() if k != "index_topk"}
    (glm5 / "config.json").write_text(json.dumps(config))
    assert AutoConfig.from_pretrained(glm5).index_topk == 2048  # the class default comes back
    assert is_deepseek_dsa(sglang_dir)(AutoConfig.from_pretrained(glm5))
    assert "index_topk=2048" in dsa_problem(str(glm5), "test", sglang_dir)


def test_the_view_is_dense_mla_and_the_same_model(glm5, sglang_dir, tmp_path):
    view_dir = tmp_path / "view"
    view = make_view(glm5, view_dir)
    assert view.dsa and view.changed and view.linked == 2 and view.checked.startswith("transformers 5.12.1")
    original, loaded = AutoConfig.from_pretrained(glm5), AutoConfig.from_pretrained(view_dir)
    assert getattr(loaded, "index_topk", None) is None and not is_deepseek_dsa(sglang_dir)(loaded)
    assert loaded.architectures == ["GlmMoeDsaForCausalLM"]  # SGLang's GLM-5 model class still serves it
    for field in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "q_lora_rank",
                  "num_attention_heads", "hidden_size", "rope_parameters", "max_position_embeddings", "rms_norm_eps"):
        assert getattr(loaded, field) == getattr(original, field), field
    assert dsa_problem(str(view_dir), "test", sglang_dir) == ""
    assert dsa_problem(str(glm5), "test", sglang_dir)  # the checkpoint itself is still refused
    assert sorted(p.name for p in view_dir.iterdir() if p.is_symlink()) == ["model.safetensors", "tokenizer.json"]
    assert (view_dir / "model.safetensors").resolve() == glm5 / "model.safetensors"
    assert not make_view(glm5, view_dir).changed  # a second deploy finds nothing to do


def test_a_dense_checkpoint_is_mirrored_and_a_missing_one_named(tmp_path, capsys):
    dense = tmp_path / "dense"
    dense.mkdir()
    config = {k: v for k, v in target_config().items() if not k.startswith("index")} | {"model_type": "deepseek_v3"}
    (dense / "config.json").write_text(json.dumps(config))
    assert cli(["model-view", str(dense), str(tmp_path / "view"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["dsa"] is False and json.loads((tmp_path / "view" / "config.json").read_text()) == config
    with pytest.raises(ModelViewError, match=r"has no config\.json"):
        make_view(tmp_path / "nowhere", tmp_path / "view2")
    assert cli(["model-view", str(tmp_path / "nowhere"), str(tmp_path / "view3")]) == 1
    assert "ddtree_model_path must be a checkpoint folder" in capsys.readouterr().err


def _launch(kv_cache_dtype: str = "bfloat16", page_size: int = 1):
    from types import SimpleNamespace

    return SimpleNamespace(page_size=page_size, attention_backend="triton", kv_cache_dtype=kv_cache_dtype)


def test_a_dsa_checkpoint_passes_only_on_the_patched_sglang_with_a_bf16_cache(glm5, sglang_dir, patched_sglang_dir):
    """ddtree_dsa_attention: dsa. Patch 0007 found in the installed source (its patched-source checks) and the
    launch's page size, backend and cache as the DSA tree verify serves them: no problem; otherwise the
    refusal names what is missing and the dense view as the other way."""
    assert dsa_problem(str(glm5), "test", patched_sglang_dir, args=_launch()) == ""
    unpatched = dsa_problem(str(glm5), "test", sglang_dir, args=_launch())
    assert "patch 0007" in unpatched and "indexer stages its queries" in unpatched
    assert "ddtree_dsa_attention: dense-view" in unpatched
    fp8 = dsa_problem(str(glm5), "test", patched_sglang_dir, args=_launch("fp8_e4m3", page_size=64))
    assert "--kv-cache-dtype fp8_e4m3 (needs bfloat16" in fp8 and "--page-size 64 (needs 1)" in fp8
