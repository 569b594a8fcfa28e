"""issue 18: gpt-oss-20b and gpt-oss-120b, parameters exact against transformers' meta model and
OpenAI's published figures under OpenAI's own convention, and the MXFP4 checkpoint's bytes.

- OpenAI's model card: gpt-oss-20b 20.9B total / 3.6B active, gpt-oss-120b 116.8B / 5.1B, the
  active counts without the input embedding table (3,608,307,264 and 5,132,849,472 exactly);
- the checkpoints' model.safetensors.index.json total_size: 13,761,264,768 bytes for 20b (the
  index copied whole in a public GitHub repository: find_string '"total_size": 13761264768'),
  65,248,815,744 for 120b (the tensor bytes of its 15 shards in a public model-inventory test:
  find_string '65248815744'). MXFP4 experts (4-bit e2m1 values, one e8m0 scale per 32), the
  rest bf16: graphllm's stored bytes equal both to the byte.
"""

import pytest

from graphllm import Workload, build_graph, load_config
from graphllm.passes import run
from tests.support.meta_models import published_meta_model

TOTAL = {"gpt-oss-20b": 20_914_757_184, "gpt-oss-120b": 116_829_156_672}
ACTIVE_WITHOUT_EMBEDDING = {"gpt-oss-20b": 3_608_307_264, "gpt-oss-120b": 5_132_849_472}
CHECKPOINT_BYTES = {"gpt-oss-20b": 13_761_264_768, "gpt-oss-120b": 65_248_815_744}


def _graph(preset: str):
    return build_graph(load_config(preset), Workload(seq_len=1))


@pytest.mark.parametrize("preset", sorted(TOTAL))
def test_total_and_active_under_openais_convention(preset):
    p = run(_graph(preset), ["params"])["params"]
    assert p.total == TOTAL[preset]
    assert p.active_without_embedding == ACTIVE_WITHOUT_EMBEDDING[preset]
    assert p.active == p.active_without_embedding + 201_088 * 2880
    # the model card's rounding: 20.9B / 3.6B and 116.8B / 5.1B
    card = {"gpt-oss-20b": (20.9, 3.6), "gpt-oss-120b": (116.8, 5.1)}[preset]
    assert (round(p.total / 1e9, 1), round(p.active_without_embedding / 1e9, 1)) == card


@pytest.mark.parametrize("preset", sorted(CHECKPOINT_BYTES))
def test_mxfp4_checkpoint_bytes_match_the_published_index(preset):
    m = run(_graph(preset), ["memory"])["memory"]
    assert m.weights == CHECKPOINT_BYTES[preset]
    assert set(m.weights_by_dtype) == {"bf16", "mxfp4"}


@pytest.mark.parametrize("preset", sorted(TOTAL))
def test_total_matches_transformers_meta_model(preset):
    model = published_meta_model(preset)
    assert sum(t.numel() for t in model.parameters()) == TOTAL[preset]


def test_experts_are_the_only_mxfp4_tensors():
    g = _graph("gpt-oss-20b")
    stored = {n.name: n.attrs.get("stored") for n in g.params()}
    quantized = sorted(n for n, f in stored.items() if f is not None)
    assert len(quantized) == 2 * 24
    assert all(n.endswith((".experts.gate_up_proj", ".experts.down_proj")) for n in quantized)
    assert stored["model.layers.0.mlp.experts.gate_up_proj_bias"] is None
    assert stored["model.layers.0.mlp.router.weight"] is None
