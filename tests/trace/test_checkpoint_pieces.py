"""How a traced model's tensor is put back together from a checkpoint that stores it in pieces
(graphllm.trace.hf.pieces): the converters transformers loads with, read, and any conversion
other than stacking and joining left unread rather than guessed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("transformers")
from graphllm.trace.hf import pieces

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
