"""The builder labels weights and scopes from the one declared vocabulary (graphllm.build.kinds)."""

import pytest

from graphllm import build_graph, load_config
from graphllm.build.kinds import LAYER, SCOPE_KINDS, WEIGHT_KINDS


@pytest.mark.parametrize(
    "preset", ["llama3-8b", "qwen1.5-moe-a2.7b", "phi3-mini", "gemma-2b", "deepseek-v3"]
)
def test_every_label_is_declared(preset):
    cfg = load_config(preset)
    cfg = cfg.with_layers(2)
    g = build_graph(cfg, mtp=cfg.num_nextn_predict_layers > 0)
    assert {p.attrs["kind"] for p in g.params()} <= set(WEIGHT_KINDS)
    assert set(g.meta["scopes"].values()) <= {*SCOPE_KINDS, LAYER}
