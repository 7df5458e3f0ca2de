"""The GPU run's stand-in models on the CPU (shapes on the meta device, nothing allocated): the GLM-5-weight
stand-in's arithmetic, its DSA indexer weights, and that it fits the H200 with KV for 185k tokens."""

from __future__ import annotations

import math

import pytest

from tests.server_gpu import models

H200_BYTES = 139 * 2**30  # what the device machine reports (about 139 GiB)


def test_the_mlp_holds_what_one_gpu_reads_of_glm5s_experts_a_step():
    assert models.GLM5_EXPERT_PARAMS == 37_748_736
    assert models.expert_bytes_per_gpu() == 23_887_872  # 9 x 37.7 M x 0.5625 B / 8
    si = models.STAND_INS["glm5-weight"]
    assert si.layers == 78 and si.mlp_width == 648
    assert 3 * models.HIDDEN * si.mlp_width * 2 == models.expert_bytes_per_gpu()  # exact, not rounded


def test_drafter_reads_dflash_evenly_spaced_target_layers():
    assert models.dflash_target_layer_ids(78) == (1, 20, 38, 56, 75)
    cfg = models.drafter_config("glm5-weight")
    assert cfg["num_target_layers"] == 78 and cfg["dflash_config"]["target_layer_ids"] == [1, 20, 38, 56, 75]
    assert models.drafter_shapes(cfg)["fc.weight"] == (models.HIDDEN, 5 * models.HIDDEN)
    assert models.drafter_config("small")["dflash_config"]["target_layer_ids"] == [1, 2, 3, 5, 6]  # earlier runs


@pytest.mark.parametrize("stand_in", ["glm5-weight", "small"])
def test_target_layout_and_fit(stand_in):
    cfg = models.target_config(stand_in)
    shapes = models.target_shapes(cfg)
    si = models.STAND_INS[stand_in]
    layers = {int(n.split(".")[2]) for n in shapes if n.startswith("model.layers.")}
    assert layers == set(range(si.layers))
    for i in (0, si.layers - 1):
        p = f"model.layers.{i}."
        assert shapes[p + "mlp.gate_proj.weight"] == (si.mlp_width, models.HIDDEN)
        # GLM-5's indexer, replicated on every GPU: 32 heads of 128 from the q LoRA, one 128-wide key, head gates
        assert shapes[p + "self_attn.indexer.wq_b.weight"] == (32 * 128, 2048)
        assert shapes[p + "self_attn.indexer.wk.weight"] == (128, models.HIDDEN)
        assert shapes[p + "self_attn.indexer.weights_proj.weight"] == (32, models.HIDDEN)
        assert shapes[p + "self_attn.kv_a_proj_with_mqa.weight"] == (512 + 64, models.HIDDEN)
    weights = 2 * sum(math.prod(s) for s in shapes.values())
    kv = si.layers * 190_000 * (576 * 2 + 132)  # bf16 latent rows and the DSA index keys a token, a layer
    assert weights + kv < 0.6 * H200_BYTES, (weights / 2**30, kv / 2**30)
