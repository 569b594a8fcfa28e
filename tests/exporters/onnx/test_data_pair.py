"""A model and its external data file always come from the same export: the data file has a name
of its own on every export, is in place before the model that names it, and the pair is
checked when a model is loaded."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from graphllm.build.builder import build_export_graph
from graphllm.errors import GraphllmError, Interrupted
from graphllm.exporters.onnx import export_onnx
from graphllm.exporters.onnx.export import DATA_HEADER, check_data_file
from graphllm.models.config import load_config
from tests.support.paths import REPO

TINY = REPO / "examples" / "tiny.yaml"


@pytest.fixture(scope="module")
def graph():
    return build_export_graph(load_config(TINY))


def _export(graph, path: Path, seed: int = 0):
    return export_onnx(graph, path, seed=seed, external_data=True, check=False, device="cpu")


def _named(path: Path) -> str:
    props = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
    return json.loads(props["graphllm.data"])["file"]


def test_the_data_file_is_named_by_the_export(graph, tmp_path):
    r = _export(graph, tmp_path / "m.onnx")
    assert re.fullmatch(r"m\.onnx\.[0-9a-f]{8}\.data", r.data_path.name)
    assert _named(r.path) == r.data_path.name
    assert r.data_path.read_bytes().startswith(DATA_HEADER)
    check_data_file(r.path)


def test_a_new_export_removes_the_old_data_file(graph, tmp_path):
    legacy = tmp_path / "m.onnx.data"  # the name exports had before
    legacy.write_bytes(b"old")
    first = _export(graph, tmp_path / "m.onnx")
    second = _export(graph, tmp_path / "m.onnx", seed=1)
    assert first.data_path != second.data_path
    assert sorted(tmp_path.iterdir()) == sorted([second.path, second.data_path])


def test_an_old_model_beside_another_exports_data_is_refused(graph, tmp_path):
    (tmp_path / "a").mkdir()
    a = _export(graph, tmp_path / "a" / "m.onnx")
    b = _export(graph, tmp_path / "b.onnx", seed=1)
    shutil.copy(b.data_path, a.data_path)  # same size, other weights: only the token tells
    with pytest.raises(GraphllmError, match="not the weights file"):
        check_data_file(a.path)


def test_a_missing_data_file_is_refused_on_load(graph, tmp_path):
    from graphllm.runtime.session import OnnxModel

    r = _export(graph, tmp_path / "m.onnx")
    r.data_path.unlink()
    with pytest.raises(GraphllmError, match="is missing"):
        OnnxModel(r.path, "cpu")


def test_a_truncated_data_file_is_refused(graph, tmp_path):
    r = _export(graph, tmp_path / "m.onnx")
    with open(r.data_path, "r+b") as f:
        f.truncate(r.data_path.stat().st_size // 2)
    with pytest.raises(GraphllmError, match="not the weights file"):
        check_data_file(r.path)


def test_an_interrupted_export_leaves_the_old_pair(graph, tmp_path, monkeypatch):
    old = _export(graph, tmp_path / "m.onnx")
    old_bytes = old.path.read_bytes()

    def interrupted(*args, **kwargs):
        raise Interrupted(15)  # the signal arriving between the data file and the model

    monkeypatch.setattr(onnx, "save_model", interrupted)
    with pytest.raises(Interrupted):
        _export(graph, tmp_path / "m.onnx", seed=1)
    assert sorted(tmp_path.iterdir()) == sorted([old.path, old.data_path])
    assert old.path.read_bytes() == old_bytes
    check_data_file(old.path)


_CHILD = """
import sys
from graphllm.build.builder import build_export_graph
from graphllm.exporters.onnx import export_onnx
from graphllm.models.config import load_config
g = build_export_graph(load_config(sys.argv[1]))
for _ in range(3):
    export_onnx(g, sys.argv[2], seed=int(sys.argv[3]), external_data=True, check=False, device="cpu")
"""


def test_concurrent_exports_to_one_target_end_with_a_pair(tmp_path):
    out = tmp_path / "m.onnx"
    children = [
        subprocess.Popen([sys.executable, "-c", _CHILD, str(TINY), str(out), str(seed)])
        for seed in (1, 2)
    ]
    assert [c.wait(timeout=120) for c in children] == [0, 0]
    data = [p for p in tmp_path.iterdir() if p != out]
    assert [p.name for p in data] == [_named(out)]
    check_data_file(out)
    from graphllm.runtime.session import OnnxModel

    logits = OnnxModel(out, "cpu").forward(np.array([[1, 2, 3]]))["logits"]
    assert np.isfinite(logits).all()
