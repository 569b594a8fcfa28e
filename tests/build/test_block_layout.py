"""The builder reads the block's layout from the config: where its norms sit (pre, post, both or
none around each sub-layer, by their checkpoint names), parallel sub-layers, NoPE layers and the
RoPE channel pairing, and the MoE block's checkpoint names. Each option is built from a
ModelConfig made by hand and checked by structure (which norms exist, what each node reads), by
running it (numpy, and onnxruntime through the decomposed export) and by the tokens pass.
"""

from __future__ import annotations

import numpy as np
import pytest

from graphllm.build.builder import build_export_graph, build_graph
from graphllm.build.weights import random_weights
from graphllm.models.model_config import BlockLayout, ModelConfig, MoENames
from graphllm.models.workload import Workload
from graphllm.runtime.interpret import run_graph
from graphllm.runtime.observe import check_token_mixing
from tests.support.tiny_configs import MODEL_CONFIG_FIELDS

L0, L1 = "model.layers.0", "model.layers.1"
EMBED = "model.embed_tokens"
NORM_KINDS = (
    "input_layernorm",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",
    "post_feedforward_layernorm",
    "post_self_attn_layernorm",
    "post_mlp_layernorm",
)


def tiny(**fields) -> ModelConfig:
    """Two layers of GQA attention and a gated MLP; `fields` set the layout under test."""
    return ModelConfig(**(MODEL_CONFIG_FIELDS | fields))


def graph(cfg: ModelConfig, seq_len: int = 3, past_len: int = 0):
    return build_graph(cfg, Workload(batch=2, seq_len=seq_len, past_len=past_len, dtype="fp32"))


def reads(g, name: str) -> tuple[str, ...]:
    """The nodes `name` reads, as names relative to layer 0 where they lie in it."""
    return tuple(r.node.removeprefix(f"{L0}.") for r in g[name].inputs)


def norms(g, layer: str = L0) -> set[str]:
    return {n.name.removeprefix(f"{layer}.") for n in g.scope(layer) if n.op == "rmsnorm"}


SANDWICH = BlockLayout(  # Gemma 2/3
    attention_post="post_attention_layernorm",
    ffn_pre="pre_feedforward_layernorm",
    ffn_post="post_feedforward_layernorm",
)
POST = BlockLayout(  # OLMo 2
    attention_pre=None,
    attention_post="post_attention_layernorm",
    ffn_pre=None,
    ffn_post="post_feedforward_layernorm",
)
GLM4 = BlockLayout(  # GLM-4's names for the same four places
    attention_post="post_self_attn_layernorm",
    ffn_post="post_mlp_layernorm",
)
PARALLEL_SHARED = BlockLayout(ffn_pre=None, parallel=True)  # Cohere: one input_layernorm
PARALLEL_OWN = BlockLayout(parallel=True)  # GPT-NeoX: a norm for each, both on the input
NO_NORMS = BlockLayout(attention_pre=None, ffn_pre=None)

# layout -> (the block's norms, and what the nodes at the sub-layers' edges read)
LAYOUTS: dict[str, tuple[BlockLayout, set[str], dict[str, tuple[str, ...]]]] = {
    "llama": (
        BlockLayout(),
        {"input_layernorm", "post_attention_layernorm"},
        {
            "input_layernorm": (EMBED, "input_layernorm.weight"),
            "self_attn.q_proj": ("input_layernorm", "self_attn.q_proj.weight"),
            "attn_residual": (EMBED, "self_attn.o_proj"),
            "post_attention_layernorm": ("attn_residual", "post_attention_layernorm.weight"),
            "mlp.gate_proj": ("post_attention_layernorm", "mlp.gate_proj.weight"),
            "mlp_residual": ("attn_residual", "mlp.down_proj"),
        },
    ),
    "sandwich": (
        SANDWICH,
        {
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        },
        {
            "self_attn.q_proj": ("input_layernorm", "self_attn.q_proj.weight"),
            "post_attention_layernorm": ("self_attn.o_proj", "post_attention_layernorm.weight"),
            "attn_residual": (EMBED, "post_attention_layernorm"),
            "pre_feedforward_layernorm": ("attn_residual", "pre_feedforward_layernorm.weight"),
            "mlp.gate_proj": ("pre_feedforward_layernorm", "mlp.gate_proj.weight"),
            "post_feedforward_layernorm": ("mlp.down_proj", "post_feedforward_layernorm.weight"),
            "mlp_residual": ("attn_residual", "post_feedforward_layernorm"),
        },
    ),
    "post": (
        POST,
        {"post_attention_layernorm", "post_feedforward_layernorm"},
        {
            "self_attn.q_proj": (EMBED, "self_attn.q_proj.weight"),
            "post_attention_layernorm": ("self_attn.o_proj", "post_attention_layernorm.weight"),
            "attn_residual": (EMBED, "post_attention_layernorm"),
            "mlp.gate_proj": ("attn_residual", "mlp.gate_proj.weight"),
            "post_feedforward_layernorm": ("mlp.down_proj", "post_feedforward_layernorm.weight"),
            "mlp_residual": ("attn_residual", "post_feedforward_layernorm"),
        },
    ),
    "glm4-names": (
        GLM4,
        {
            "input_layernorm",
            "post_self_attn_layernorm",
            "post_attention_layernorm",
            "post_mlp_layernorm",
        },
        {
            "attn_residual": (EMBED, "post_self_attn_layernorm"),
            "post_attention_layernorm": ("attn_residual", "post_attention_layernorm.weight"),
            "mlp_residual": ("attn_residual", "post_mlp_layernorm"),
        },
    ),
    "parallel-shared-norm": (
        PARALLEL_SHARED,
        {"input_layernorm"},
        {
            "self_attn.q_proj": ("input_layernorm", "self_attn.q_proj.weight"),
            "mlp.gate_proj": ("input_layernorm", "mlp.gate_proj.weight"),
            "mlp.up_proj": ("input_layernorm", "mlp.up_proj.weight"),
            "attn_residual": (EMBED, "self_attn.o_proj"),
            "mlp_residual": ("attn_residual", "mlp.down_proj"),
        },
    ),
    "parallel-own-norms": (
        PARALLEL_OWN,
        {"input_layernorm", "post_attention_layernorm"},
        {
            "input_layernorm": (EMBED, "input_layernorm.weight"),
            "post_attention_layernorm": (EMBED, "post_attention_layernorm.weight"),
            "self_attn.q_proj": ("input_layernorm", "self_attn.q_proj.weight"),
            "mlp.gate_proj": ("post_attention_layernorm", "mlp.gate_proj.weight"),
            "attn_residual": (EMBED, "self_attn.o_proj"),
            "mlp_residual": ("attn_residual", "mlp.down_proj"),
        },
    ),
    "no-norms": (
        NO_NORMS,
        set(),
        {
            "self_attn.q_proj": (EMBED, "self_attn.q_proj.weight"),
            "mlp.gate_proj": ("attn_residual", "mlp.gate_proj.weight"),
            "mlp_residual": ("attn_residual", "mlp.down_proj"),
        },
    ),
}


@pytest.mark.parametrize("case", LAYOUTS)
def test_the_block_places_its_norms_and_residuals_as_the_layout_says(case):
    layout, want_norms, want_reads = LAYOUTS[case]
    g = graph(tiny(block=layout))
    g.verify()
    assert norms(g) == want_norms
    for name, inputs in want_reads.items():
        assert reads(g, f"{L0}.{name}") == inputs, name
    # every block has the same layout: layer 1 reads layer 0's output where layer 0 reads the
    # embedding, and each norm is one param of the hidden width
    first = next(n for n in g.scope(L1) if n.inputs and n.op != "param")
    assert f"{L0}.mlp_residual" in {r.node for r in first.inputs}
    assert norms(g, L1) == want_norms
    assert all(g[f"{L0}.{n}.weight"].out.format() == "32" for n in want_norms)
    assert all(g.meta["scopes"][f"{L0}.{n}"] == "norms" for n in want_norms)


def test_the_default_layout_builds_the_graph_the_llama_family_loads():
    from graphllm.models.config import load_config

    # tiny()'s fields as a config.json spells them, with the two the llama family reads besides
    as_json = {k: v for k, v in MODEL_CONFIG_FIELDS.items() if k != "name"}
    loaded = load_config(as_json | {"rms_norm_eps": 1e-6, "max_position_embeddings": 4096})
    assert loaded.block == BlockLayout() and loaded.rope_layers == ()
    hand = tiny()
    assert graph(hand).print().replace("tiny", "llama") == graph(loaded).print()


@pytest.mark.parametrize("case", LAYOUTS)
@pytest.mark.parametrize("moe", [False, True])
def test_every_layout_runs_prefill_and_a_cached_step(case, moe):
    cfg = tiny(block=LAYOUTS[case][0], **(MOE if moe else {}))
    ids = np.random.default_rng(0).integers(0, 64, (2, 4))
    g = graph(cfg, seq_len=4)
    weights = random_weights(g, seed=1, scale=0.2)
    full = run_graph(g, weights, ids)
    assert np.isfinite(full["logits"]).all()
    # the same positions, the last one decoded against the cache of the first three
    head = run_graph(graph(cfg, seq_len=3), weights, ids[:, :3])
    past = {k: v for k, v in head.items() if k.startswith("present.")}
    step = run_graph(graph(cfg, seq_len=1, past_len=3), weights, ids[:, 3:], past)
    np.testing.assert_allclose(step["logits"][:, 0], full["logits"][:, 3], atol=1e-5, rtol=0)


MOE = {
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 16,
    "shared_expert_intermediate_size": 24,
    "shared_expert_gate": True,
    "moe_layers": (True, False),
    "norm_topk_prob": True,
}


def test_an_moe_ffn_sits_inside_the_layouts_norms():
    g = graph(tiny(block=SANDWICH, **MOE))
    p = f"{L0}.mlp"
    assert reads(g, f"{p}.gate") == ("pre_feedforward_layernorm", "mlp.gate.weight")
    assert reads(g, f"{L0}.post_feedforward_layernorm")[0] == "mlp.add_shared"
    assert reads(g, f"{L0}.mlp_residual") == ("attn_residual", "post_feedforward_layernorm")
    assert reads(g, f"{L1}.post_feedforward_layernorm")[0] == f"{L1}.mlp.down_proj"  # dense


def test_the_moe_block_takes_the_checkpoints_names_from_the_config():
    names = MoENames(
        block="block_sparse_moe",
        router="router",
        expert_gate="w1",
        expert_up="w3",
        expert_down="w2",
        shared="shared_experts",
        shared_gate="shared_experts_gate",
    )
    g = graph(tiny(moe_names=names, **MOE))
    p = f"{L0}.block_sparse_moe"
    params = {n.name for n in g.params() if n.name.startswith(p)}
    assert params == {
        f"{p}.router.weight",
        f"{p}.experts.*.w1.weight",
        f"{p}.experts.*.w3.weight",
        f"{p}.experts.*.w2.weight",
        f"{p}.shared_experts.gate_proj.weight",
        f"{p}.shared_experts.up_proj.weight",
        f"{p}.shared_experts.down_proj.weight",
        f"{p}.shared_experts_gate.weight",
    }
    assert reads(g, f"{p}.router.softmax") == ("block_sparse_moe.router",)
    assert reads(g, f"{p}.shared_experts.gated") == (
        "block_sparse_moe.shared_experts.down_proj",
        "block_sparse_moe.shared_experts_gate.sigmoid",
    )
    scopes = g.meta["scopes"]
    assert scopes[p] == "moe" and scopes[f"{p}.router"] == "router"
    assert scopes[f"{p}.shared_experts_gate"] == "router"
    assert scopes[f"{p}.shared_experts"] == "shared_expert"
    assert not any(n.name.startswith(f"{L0}.mlp.") for n in g.nodes())


def test_a_nope_layer_attends_without_rotating_q_and_k():
    g = graph(tiny(rope_layers=(True, False)), past_len=2)
    assert g[f"{L0}.self_attn.q_rope"].op == g[f"{L0}.self_attn.k_rope"].op == "rope"
    a1 = f"{L1}.self_attn"
    assert not any(n.op in ("rope", "rope_pairs") for n in g.scope(L1))
    assert reads(g, f"{a1}.core.scores") == (f"{a1}.q_heads", f"{a1}.k_repeat")
    # the cache holds the keys unrotated
    assert reads(g, f"{a1}.k_cache") == ("past_key_values.1.key", f"{a1}.k_heads")
    assert g.outputs["present.1.key"].node == f"{a1}.k_cache"


def test_a_nope_layer_still_mixes_tokens_only_causally():
    # the tokens pass's prediction equals what perturbing each input position shows
    cfg = tiny(
        rope_layers=(False, True),
        layer_types=("full_attention", "sliding_attention"),
        sliding_window=3,
    )
    check = check_token_mixing(cfg, seq_len=8)
    assert check.agrees, check.differences()
    assert check_token_mixing(tiny(rope_layers=(False, False)), seq_len=6).agrees


@pytest.mark.parametrize("rope", [(False, False), (True, False)])
def test_positions_reach_the_logits_through_rope_layers_only(rope):
    g = graph(tiny(rope_layers=rope), seq_len=3)
    w = random_weights(g, seed=2, scale=0.2)
    ids = np.random.default_rng(3).integers(0, 64, (2, 3))
    shifted = {"position_ids": np.arange(5, 8)[None].repeat(2, 0)}
    at_zero, later = run_graph(g, w, ids)["logits"], run_graph(g, w, ids, extra=shifted)["logits"]
    assert np.array_equal(at_zero, later) == (not any(rope))


@pytest.mark.parametrize("layout", ["complex", "interleave"])
def test_standard_attention_pairs_rope_channels_as_the_config_says(layout):
    g = graph(tiny(rope_layout=layout))
    for k in ("q_rope", "k_rope"):
        n = g[f"{L0}.self_attn.{k}"]
        assert n.op == "rope_pairs" and n.attrs["layout"] == layout
    assert g[f"{L0}.self_attn.q_rope"].attrs["inv_freq"].shape == (4,)


EXPORTED = {
    "sandwich": tiny(block=SANDWICH),
    "post": tiny(block=POST),
    "parallel": tiny(block=PARALLEL_SHARED, rope_layout="complex"),
    "nope": tiny(rope_layers=(True, False), block=PARALLEL_OWN, **MOE),
}


@pytest.mark.parametrize("case", EXPORTED)
def test_the_decomposed_export_runs_every_layout_like_the_interpreter(case, tmp_path):
    pytest.importorskip("onnxruntime")
    from graphllm.exporters.onnx.export import export_onnx, read_metadata
    from graphllm.runtime.session import OnnxModel

    cfg = EXPORTED[case]
    path = tmp_path / "m.onnx"
    export_onnx(build_export_graph(cfg), path, seed=3, ops="decomposed")
    assert read_metadata(path).config == cfg  # the layout survives the file's metadata
    model = OnnxModel(path, device="cpu")
    ids = np.random.default_rng(4).integers(0, 64, (2, 5))
    g = graph(cfg, seq_len=5)
    want = run_graph(g, random_weights(g, seed=3), ids)["logits"]
    np.testing.assert_allclose(model.forward(ids)["logits"], want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("case", EXPORTED)
@pytest.mark.parametrize(
    "strategy",
    [{"tp": 2}, {"tp": 2, "sp": True}, {"pp": 2, "microbatches": 2}, {"cp": 2}],
    ids=["tp", "tp-sp", "pp", "cp"],
)
def test_every_layout_partitions_to_the_single_device_result(case, strategy):
    from graphllm.passes.parallel.partition import Strategy, partition
    from graphllm.runtime.spmd import check_partition

    g = build_graph(EXPORTED[case], Workload(batch=4, seq_len=8, dtype="fp32"))
    check = check_partition(g, partition(g, Strategy(**strategy)), seed=1)
    assert check.max_diff <= 1e-5, check.differences(3)
    assert all(v <= 1e-5 for v in check.others.values()), check.others


def test_a_nope_layer_is_a_layer_kind_of_its_own():
    from graphllm.passes.parallel.plan import layer_kinds, reduced_config

    cfg = tiny(num_hidden_layers=4, rope_layers=(True, True, True, False))
    assert len(set(layer_kinds(cfg))) == 2
    small, where = reduced_config(cfg)
    assert small.num_hidden_layers == 2 and small.rope_layers == (True, False)
    assert where == [0, 0, 0, 1]
