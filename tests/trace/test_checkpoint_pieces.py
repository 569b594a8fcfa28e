"""How a traced model's tensor is read from a checkpoint that stores it otherwise: put back
together from pieces (graphllm.trace.hf.pieces), or sliced out of a tensor that joins it with
others (slices); the converters transformers loads with, read, and any other conversion left
unread (refused where the tensor is read, by name) rather than guessed."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("transformers")
from safetensors.numpy import save_file

from graphllm.build.weights import load_weights
from graphllm.errors import WeightsError
from graphllm.ir import Dim, Graph, TensorType
from graphllm.trace.hf import causal_lm, checkpoint_names, hf_config, pieces, slices
from tests.support.traced import TINY

E, F, D = 3, 4, 8


def _op(kind: str, **fields):
    return type(kind, (), {})() if not fields else type(kind, (), fields)()


def _saved(*names: str, shape=(F, D)):
    return {n: SimpleNamespace(shape=shape) for n in names}


def _experts(proj: str):
    return [f"model.layers.0.mlp.experts.{e}.{proj}.weight" for e in range(E)]


GATE_UP = SimpleNamespace(
    source_patterns=["mlp.experts.*.gate_proj.weight", "mlp.experts.*.up_proj.weight"],
    target_patterns=["mlp.experts.gate_up_proj"],
    operations=[_op("MergeModulelist", dim=0), _op("Concatenate", dim=1)],
)


def test_stacked_then_joined_in_pattern_and_index_order():
    saved = _saved(*reversed(_experts("up_proj")), *_experts("gate_proj"))
    got = pieces([GATE_UP], "model.layers.0.mlp.experts.gate_up_proj", (E, 2 * F, D), saved)
    assert got == {"parts": [_experts("gate_proj"), _experts("up_proj")], "stack": 0, "concat": 1}


@pytest.mark.parametrize(
    "change",
    [
        {"operations": [_op("MergeModulelist", dim=0), _op("Transpose", dim0=0, dim1=1)]},
        {"operations": [_op("Concatenate", dim=1)]},  # no stack: not one tensor an expert
    ],
)
def test_any_other_conversion_is_not_read(change):
    conv = SimpleNamespace(**{**vars(GATE_UP), **change})
    saved = _saved(*_experts("gate_proj"), *_experts("up_proj"))
    assert pieces([conv], "model.layers.0.mlp.experts.gate_up_proj", (E, 2 * F, D), saved) is None


def test_pieces_that_do_not_make_the_tensor_are_not_read():
    saved = _saved(*_experts("gate_proj"), *_experts("up_proj")[:2])  # an expert's up missing
    name = "model.layers.0.mlp.experts.gate_up_proj"
    assert pieces([GATE_UP], name, (E, 2 * F, D), saved) is None
    saved = _saved(*_experts("gate_proj"), *_experts("up_proj"))
    assert pieces([GATE_UP], name, (E, 2 * F, 2 * D), saved) is None  # another shape


def test_patterns_are_read_as_transformers_reads_them():
    # DeepSeek-V4's source patterns are regexes (`\\.experts.*.w1.weight`)
    conv = SimpleNamespace(
        **{**vars(GATE_UP), "source_patterns": [r"\.experts.*.w1.weight", r"\.experts.*.w3.weight"]}
    )
    w1 = [f"model.layers.0.mlp.experts.{e}.w1.weight" for e in range(E)]
    w3 = [f"model.layers.0.mlp.experts.{e}.w3.weight" for e in range(E)]
    got = pieces([conv], "model.layers.0.mlp.experts.gate_up_proj", (E, 2 * F, D), _saved(*w3, *w1))
    assert got == {"parts": [w1, w3], "stack": 0, "concat": 1}


CONVS = SimpleNamespace(
    source_patterns=[f"linear_attn.{x}_conv1d.weight" for x in "qkv"],
    target_patterns=["linear_attn.conv1d.weight"],
    operations=[_op("Concatenate", dim=0, num_shards_attribute=None)],
)


def test_one_piece_a_pattern_joined():
    """OLMo-Hybrid's conv: one tensor in the model, a q, a k and a v conv in its checkpoint
    (transformers saves it in equal chunks, whatever the q, k and v widths)."""
    names = [f"model.layers.0.linear_attn.{x}_conv1d.weight" for x in "qkv"]
    saved = {n: SimpleNamespace(shape=(w, 1, 4)) for n, w in zip(names, (43, 43, 42))}
    name = "model.layers.0.linear_attn.conv1d.weight"
    got = pieces([CONVS], name, (128, 1, 4), dict(reversed(saved.items())))
    assert got == {"parts": [[n] for n in names], "stack": None, "concat": 0}
    assert pieces([CONVS], name, (129, 1, 4), saved) is None  # pieces that do not make it
    experts = SimpleNamespace(**{**vars(CONVS), "source_patterns": ["experts.*.w1.weight"]})
    assert pieces([experts], name, (128, 1, 4), saved) is None  # a list, not one piece


QKV = SimpleNamespace(
    source_patterns=["query_key_value"],
    target_patterns=["q_proj", "k_proj", "v_proj"],
    operations=[_op("Split", dim=0)],
)
QKV_PARTS = [
    (f"model.layers.0.self_attn.{x}_proj.weight", (r, D)) for x, r in zip("qkv", (8, 4, 4))
]
STORED = "model.layers.0.attention.query_key_value.weight"


def test_a_tensor_split_on_loading_is_read_as_slices_in_target_order():
    got = slices(QKV, QKV_PARTS, STORED, (16, D))
    spans = {n: (h["start"], h["stop"]) for n, h in got.items()}
    assert spans == dict(zip([n for n, _ in QKV_PARTS], [(0, 8), (8, 12), (12, 16)]))
    assert {(h["slice_of"], h["axis"], h["size"]) for h in got.values()} == {(STORED, 0, 16)}
    # Chunk: equal parts, on the converter's axis (a negative one counted from the end)
    chunk = SimpleNamespace(
        source_patterns=["gate_up_proj"],
        target_patterns=["gate_proj", "up_proj"],
        operations=[_op("Chunk", dim=-1, num_shards_attribute=None)],
    )
    parts = [("m.gate_proj.weight", (D, F)), ("m.up_proj.weight", (D, F))]
    got = slices(chunk, parts, "m.gate_up_proj.weight", (D, 2 * F))
    assert [(h["axis"], h["start"], h["stop"]) for h in got.values()] == [(1, 0, F), (1, F, 2 * F)]
    assert slices(chunk, [(n, (D, F + i)) for i, (n, _) in enumerate(parts)], "x", (D, 9)) is None


@pytest.mark.parametrize(
    "change, shape",
    [
        ({}, (15, D)),  # the parts do not make the stored tensor
        ({}, (16, D + 1)),
        ({"operations": [_op("Interleave", dim=0), _op("Chunk", dim=0)]}, (16, D)),
        ({"operations": [_op("Chunk", dim=0, num_shards_attribute="n_heads")]}, (16, D)),
        ({"target_patterns": ["q_proj", "k_proj"]}, (16, D)),  # a part no pattern names
    ],
)
def test_any_other_split_is_not_read(change, shape):
    conv = SimpleNamespace(**{**vars(QKV), **change})
    assert slices(conv, QKV_PARTS, STORED, shape) is None


def _raw(model_type: str, **fields) -> dict:
    return dict(TINY, model_type=model_type, **fields)


def test_what_save_pretrained_writes_is_read_from_transformers_converters():
    """Real models on the meta device: Sarvam-MoE's fused query_key_value, OLMo-Hybrid's
    split convs, and Inkling 2's interleaved experts and unpadded head, which are not read."""
    linear = dict(
        layer_types=["linear_attention", "full_attention"],
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
    )
    models = {
        mt: checkpoint_names(causal_lm(hf_config(_raw(mt, **kw)), False, "fp32"))
        for mt, kw in [
            ("sarvam_moe", {"n_routed_experts": 4, "moe_intermediate_size": 16}),
            ("olmo_hybrid", linear),
            ("inkling2_text", {"unpadded_vocab_size": 90, "moe_intermediate_size": 16}),
        ]
    }
    q = models["sarvam_moe"]["model.layers.0.self_attn.q_proj.weight"]
    v = models["sarvam_moe"]["model.layers.0.self_attn.v_proj.weight"]
    assert q == {"slice_of": STORED, "axis": 0, "start": 0, "stop": 32, "size": 64}
    assert (v["start"], v["stop"]) == (48, 64)  # GQA: 4 heads of q, 2 of k and of v
    conv = models["olmo_hybrid"]["model.layers.0.linear_attn.conv1d.weight"]
    assert conv["parts"] == [[f"model.layers.0.linear_attn.{x}_conv1d.weight"] for x in "qkv"]
    inkling = models["inkling2_text"]
    assert inkling["model.layers.0.mlp.experts.gate_up_proj"] == {"unread": "Interleave"}
    assert inkling["lm_head.weight"] == {"unread": "Inkling2UnpadVocab"}


def _sliced_graph(stored_as: list[dict]) -> Graph:
    g = Graph("sliced")
    cols = Dim("d", "hidden", D)
    for (name, (rows, _)), how in zip(QKV_PARTS, stored_as):
        g.param(name, TensorType((Dim(f"r{rows}", "hidden", rows), cols), "fp32"), stored_as=how)
    return g


def test_the_loader_slices_the_stored_tensor_and_checks_it_splits(tmp_path):
    g = _sliced_graph(list(slices(QKV, QKV_PARTS, STORED, (16, D)).values()))
    joined = np.arange(16 * D, dtype=np.float32).reshape(16, D)
    save_file({STORED: joined}, str(tmp_path / "model.safetensors"))
    got = load_weights(g, tmp_path)
    assert [got[n].tolist() for n, _ in QKV_PARTS] == [
        joined[:8].tolist(),
        joined[8:12].tolist(),
        joined[12:].tolist(),
    ]
    save_file({STORED: joined[:15]}, str(tmp_path / "model.safetensors"))
    with pytest.raises(WeightsError) as e:
        load_weights(g, tmp_path)
    assert str(e.value) == (
        f"'{STORED}': checkpoint shape (15, {D}), where the tensors transformers splits it into "
        f"on axis 0 ({QKV_PARTS[0][0]} among them) make (16, {D})"
    )


def test_a_conversion_not_read_is_refused_by_name(tmp_path):
    g = _sliced_graph([{"unread": "Interleave, Chunk"}] * 3)
    save_file({STORED: np.zeros((16, D), np.float32)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(WeightsError) as e:
        load_weights(g, tmp_path)
    assert str(e.value) == (
        f"{QKV_PARTS[0][0]}: its checkpoint stores it through transformers' Interleave, Chunk "
        "conversion, which graphllm does not read"
    )
