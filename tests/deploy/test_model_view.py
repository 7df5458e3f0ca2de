"""The dense-MLA view of GLM-5 (ddtree-ops model-view) and the launch check's DSA decision, as SGLang sees them.

GLM-5's config (the published field set, at the test server's per-GPU sizes: tests/server_gpu/models.py)
is loaded with the DDTree branch's transformers (5.12.1), and SGLang's own `is_deepseek_dsa` is run from
the ddtree-v2 snapshot's source. The first real server run found that a config.json without index_topk
still loads as DSA (GlmMoeDsaConfig's default is 2048): the first test keeps that fact in view.
"""

from __future__ import annotations

import json
import tarfile

import pytest
from transformers import AutoConfig

from ddtree_ops.cli import main as cli
from ddtree_ops.ddtree_sources import load_sources
from ddtree_ops.launch_check import dsa_problem, is_deepseek_dsa
from ddtree_ops.model_view import ModelViewError, make_view
from tests.server_gpu.models import target_config


@pytest.fixture(scope="module")
def sglang_dir(tmp_path_factory):
    """sglang/srt/configs/model_config.py of the pinned DDTree branch (its snapshot)."""
    source = next(s for s in load_sources() if s.name == "ddtree-v2")
    dest = tmp_path_factory.mktemp("sglang") / "sglang"
    with tarfile.open(source.snapshot_path()) as tf:
        member = next(m for m in tf.getmembers() if m.name.endswith("python/sglang/srt/configs/model_config.py"))
        (dest / "srt" / "configs").mkdir(parents=True)
        (dest / "srt" / "configs" / "model_config.py").write_bytes(tf.extractfile(member).read())
    return dest


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
