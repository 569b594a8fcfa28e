"""ONNX files for the hostile-input tests: a tiny graphllm export (made once per test process)
and copies of it with its metadata changed, written as bytes into a case's sandbox."""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from graphllm.build.builder import build_export_graph
from graphllm.exporters.onnx import export_onnx
from graphllm.models.config import load_config
from tests.support.paths import EXAMPLES

DROP = object()  # a metadata value that removes the key


@functools.cache
def tiny_export() -> bytes:
    """examples/tiny.yaml exported with the decomposed lowering (seed 0), as the file's bytes."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tiny.onnx"
        graph = build_export_graph(load_config(EXAMPLES / "tiny.yaml"))
        export_onnx(graph, path, ops="decomposed", check=False)
        return path.read_bytes()


def tiny_props() -> dict[str, str]:
    model = onnx.load_from_string(tiny_export())
    return {p.key: p.value for p in model.metadata_props}


def tiny_config() -> dict:
    return json.loads(tiny_props()["graphllm.config"])


def with_metadata(changes: dict[str, object]) -> bytes:
    """The tiny export with metadata keys replaced (a str as is, anything else as JSON) or
    removed (DROP)."""
    model = onnx.load_from_string(tiny_export())
    props = {p.key: p.value for p in model.metadata_props}
    for key, value in changes.items():
        if value is DROP:
            props.pop(key, None)
        else:
            props[key] = value if isinstance(value, str) else json.dumps(value)
    del model.metadata_props[:]
    for key, value in props.items():
        model.metadata_props.add(key=key, value=value)
    return model.SerializeToString()


def with_config(**fields: object) -> bytes:
    """The tiny export whose metadata config has `fields` replaced (DROP: removed)."""
    config = {k: v for k, v in (tiny_config() | fields).items() if v is not DROP}
    return with_metadata({"graphllm.config": config})


def foreign_model() -> bytes:
    """A valid ONNX model graphllm did not write: one Identity node, no graphllm metadata."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "foreign", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def deep_json(depth: int) -> str:
    return "[" * depth + "]" * depth
