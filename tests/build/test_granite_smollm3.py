"""Granite (muP multipliers) and SmolLM3 (NoPE layers): their published configs, the ops the
multipliers and the NoPE layers become, token mixing, the KV cache, the diagrams and the
partitioned runs. Logits, FLOPs and parameters against transformers are in the shared parity
tests (tests/support/tiny_models.py CASES, test_cost_parity, test_params)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from graphllm import Workload, build_graph, load_config
from graphllm.cli import main
from graphllm.errors import ConfigError
from graphllm.exporters.dot import view_dot
from graphllm.models.config import list_presets, preset_aliases, preset_names
from graphllm.passes import run
from graphllm.passes.parallel.partition import Strategy, partition
from graphllm.runtime.observe import check_token_mixing
from graphllm.runtime.spmd import check_partition
from tests.support import tiny_configs

GRANITE = {
    **tiny_configs.LLAMA,
    "model_type": "granite",
    "embedding_multiplier": 12.0,
    "attention_multiplier": 0.125,
    "residual_multiplier": 0.22,
    "logits_scaling": 8.0,
}
# layers 1 and 2 NoPE and, with use_sliding_window, sliding; layers 0 and 3 RoPE and full
SMOLLM3 = {
    **tiny_configs.LLAMA,
    "model_type": "smollm3",
    "num_hidden_layers": 4,
    "no_rope_layers": [1, 0, 0, 1],
    "use_sliding_window": True,
    "sliding_window": 3,
}


def _mul_consts(graph) -> dict[str, float]:
    return {n.name: n.attrs["value"] for n in graph.nodes() if n.op == "mul_const"}


# -- configs as published ------------------------------------------------------------------------
def test_presets_and_their_hub_aliases():
    g = load_config("granite-3.3-8b")
    assert (g.hidden_size, g.num_hidden_layers, g.num_key_value_heads, g.head_dim) == (
        4096,
        40,
        8,
        128,
    )
    assert g.embedding_multiplier == 12.0 and g.attention_scale == 0.0078125
    assert g.residual_multiplier == 0.22 and g.logits_multiplier == 1 / 16
    assert load_config("granite-3.3-8b-instruct") == g
    s = load_config("smollm3-3b")
    assert [i for i in range(36) if not s.rotates(i)] == list(range(3, 36, 4))
    assert s.rope.theta == 5e6 and s.tie_word_embeddings
    assert load_config("SmolLM3-3B") == load_config("smollm3-3b") == s
    listed = dict(list_presets())
    assert listed["granite-3.3-8b"].startswith("ibm-granite/granite-3.3-8b-instruct:")
    assert listed["smollm3-3b"].startswith("HuggingFaceTB/SmolLM3-3B:")
    assert listed["granite-3.3-8b-instruct"] == "alias of granite-3.3-8b"
    assert listed["SmolLM3-3B"] == "alias of smollm3-3b"
    # an alias names one preset, whatever its letter case, and shadows no other
    aliases = preset_aliases()
    folded = [a.lower() for a in aliases]
    assert len(set(folded)) == len(folded)
    assert all(a.lower() == name or a.lower() not in preset_names() for a, name in aliases.items())
    r = CliRunner().invoke(main, ["presets", "--json"])
    assert {"granite-3.3-8b", "granite-3.3-8b-instruct", "smollm3-3b", "SmolLM3-3B"} <= {
        p["name"] for p in json.loads(r.stdout)
    }


def test_smollm3_nope_layers_from_the_interval_and_from_the_list():
    by_interval = load_config({**SMOLLM3, "no_rope_layers": None, "no_rope_layer_interval": 2})
    assert by_interval.rope_layers == (True, False, True, False)
    # SmolLM3Config reads the first num_hidden_layers entries of a longer list
    longer = load_config({**SMOLLM3, "no_rope_layers": [1, 0, 0, 1, 0, 0]})
    assert longer.rope_layers == (True, False, False, True)
    full, sliding = "full_attention", "sliding_attention"
    assert longer.layer_types == (full, sliding, sliding, full)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"no_rope_layers": [1, 0]}, "no_rope_layers has 2 entries for 4 hidden layers"),
        ({"no_rope_layers": [1, 2, 1, 1]}, "no_rope_layers must be a list of 0 (NoPE) and 1"),
        ({"use_sliding_window": True, "sliding_window": None}, "sliding_window is null"),
        # sliding layers named but no window on: transformers' mask and its layers disagree
        (
            {"use_sliding_window": False, "layer_types": ["sliding_attention"] * 4},
            "no sliding window is on",
        ),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor=0.5 is not modelled"),
    ],
)
def test_smollm3_refusals_are_one_line(change, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        load_config({**SMOLLM3, **change})
    assert "\n" not in str(e.value)


def test_bookkeeping_smollm3_carries_is_still_refused_where_it_computes():
    # the published SmolLM3-3B config says pretraining_tp 2, which SmolLM3 never reads
    assert load_config({**SMOLLM3, "pretraining_tp": 2, "max_window_layers": 28})
    with pytest.raises(ConfigError, match="pretraining_tp=2 is not modelled"):
        load_config({**tiny_configs.LLAMA, "pretraining_tp": 2})


@pytest.mark.parametrize("field", ["logits_scaling", "residual_multiplier", "attention_multiplier"])
def test_granite_multipliers_must_be_positive(field):
    with pytest.raises(ConfigError, match=f"{field} must be a positive number"):
        load_config({**GRANITE, field: 0})


# -- the graph -----------------------------------------------------------------------------------
def test_granite_multipliers_are_visible_ops_with_their_flops():
    graph = build_graph(load_config(GRANITE), Workload(batch=2, seq_len=5))
    scales = _mul_consts(graph)
    assert scales["model.embed_scale"] == 12.0
    assert scales["lm_head.logits_multiplier"] == 1 / 8
    for i in range(2):
        assert scales[f"model.layers.{i}.self_attn.core.scale"] == 0.125  # not 1/sqrt(d_h)
        assert scales[f"model.layers.{i}.attn_residual_scale"] == 0.22
        assert scales[f"model.layers.{i}.mlp_residual_scale"] == 0.22
        add = graph[f"model.layers.{i}.attn_residual"]
        assert add.inputs[1].node == f"model.layers.{i}.attn_residual_scale"
    assert graph.outputs["logits"].node == "lm_head.logits_multiplier"
    run(graph, ["cost"])
    d, vocab = GRANITE["hidden_size"], GRANITE["vocab_size"]
    assert graph["model.layers.0.mlp_residual_scale"].meta["cost"].flops == 2 * 5 * d
    assert graph["lm_head.logits_multiplier"].meta["cost"].flops == 2 * 5 * vocab
    # other families keep their graphs: no multiplier node where the multiplier is 1
    llama = build_graph(load_config(tiny_configs.LLAMA), Workload(seq_len=5))
    assert set(_mul_consts(llama)) == {f"model.layers.{i}.self_attn.core.scale" for i in range(2)}


def test_smollm3_nope_layers_do_not_rotate():
    graph = build_graph(load_config(SMOLLM3), Workload(seq_len=5))
    rotated = {n.name.split(".")[2] for n in graph.nodes() if n.name.endswith("_rope")}
    assert rotated == {"0", "3"}
    scores = graph["model.layers.1.self_attn.core.scores"]
    assert scores.inputs[0].node == "model.layers.1.self_attn.q_heads"
    masks = [graph[f"model.layers.{i}.self_attn.core.mask"].attrs["window"] for i in range(4)]
    assert masks == [None, 3, 3, None]


# -- token mixing and the KV cache ---------------------------------------------------------------
@pytest.mark.parametrize("config", [GRANITE, SMOLLM3], ids=["granite", "smollm3"])
def test_only_core_attention_mixes_and_perturbation_agrees(config):
    cfg = load_config(config)
    report = run(build_graph(cfg, Workload(seq_len=10)), ["tokens"])["tokens"]
    assert {op for _, op in report.mixing_nodes} == {"scores", "softmax", "pv"}
    assert all(".self_attn.core." in name for name, _ in report.mixing_nodes)
    check = check_token_mixing(cfg, seq_len=10)
    assert check.agrees, check.differences()


def test_smollm3_receptive_field_follows_each_layers_window():
    # a full layer first reaches every earlier position, and the window layers after it keep that
    report = run(build_graph(load_config(SMOLLM3), Workload(seq_len=12)), ["tokens"])["tokens"]
    assert [x["reach"] for x in report.per_layer] == [12] * 4
    # two sliding NoPE layers alone: the reach grows by W-1 a layer
    two = load_config({**SMOLLM3, "num_hidden_layers": 2, "no_rope_layers": [0, 0]})
    r = run(build_graph(two, Workload(seq_len=12)), ["tokens"])["tokens"]
    assert [x["reach"] for x in r.per_layer] == [3, 5]
    assert r.depends_on(11) == list(range(11 - 2 * (3 - 1), 12))


def test_smollm3_sliding_nope_layers_cache_the_window_only():
    cfg = load_config(SMOLLM3)
    graph = build_graph(cfg, Workload(seq_len=1, past_len=20))
    held = [
        graph.type_of(graph.outputs[f"present.{i}.key"]).shape(graph.bindings)[2] for i in range(4)
    ]
    assert held == [21, 3, 3, 21]  # a sliding layer: the last W-1 past keys and the new one
    full = load_config({**SMOLLM3, "use_sliding_window": False})
    mem = lambda c: run(build_graph(c, Workload(seq_len=1, past_len=20)), ["memory"])["memory"]  # noqa: E731
    assert mem(cfg).kv_cache == mem(full).kv_cache * (21 + 3 + 3 + 21) / (4 * 21)


# -- diagrams -------------------------------------------------------------------------------------
def test_model_view_marks_the_nope_layers_and_block_view_the_multipliers():
    dot = view_dot(build_graph(load_config(SMOLLM3), Workload(seq_len=3)), "model")
    blocks = [line for line in dot.splitlines() if "decoder block" in line]
    assert len(blocks) == 3  # layer 0, layers 1-2, layer 3
    assert "window 3, NoPE" in blocks[1] and "NoPE" not in blocks[0] + blocks[2]
    dot = view_dot(build_graph(load_config(GRANITE), Workload(seq_len=3)), "block")
    assert dot.count("× 0.22") == 2


# -- partitioning ---------------------------------------------------------------------------------
@pytest.mark.parametrize("config", [GRANITE, SMOLLM3], ids=["granite", "smollm3"])
@pytest.mark.parametrize(
    ("strategy", "workload"),
    [
        (Strategy(tp=2, sp=True), {}),
        (Strategy(cp=2), {}),
        (Strategy(pp=2, microbatches=2), {}),
        (Strategy(tp=2, cp=2), {"past_len": 5, "seq_len": 4}),  # a window shorter than the past
    ],
    ids=lambda v: v.describe().replace(" ", ",") if isinstance(v, Strategy) else None,
)
def test_partitioned_run_equals_single_device(config, strategy, workload):
    wl = Workload(**({"batch": 4, "seq_len": 8, "dtype": "fp32"} | workload))
    g = build_graph(load_config(config), wl)
    check = check_partition(g, partition(g, strategy), seed=1)
    assert check.max_diff <= 1e-5, check.differences(3)
    assert all(v <= 1e-5 for v in check.others.values()), check.others


@pytest.mark.parametrize("config", [GRANITE, SMOLLM3], ids=["granite", "smollm3"])
def test_verify_partition_command(tmp_path, config):
    f = tmp_path / "config.json"
    f.write_text(json.dumps(config))
    args = ["verify", "partition", "--config", str(f), "--tp", "2", "--sp", "--pp", "2"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert "logits equal within 1e-5" in r.stdout
