"""Fixtures more than one test folder uses: tiny transformers checkpoints (built once per session,
however many modules compare against them), an exported ONNX model, a private cache folder.

The tiny models need torch and transformers: their fixtures import them when first asked for,
so that a test run that never asks (`pytest tests/passes/test_cost.py`) does not pay for them.
"""

from __future__ import annotations

import os

# before anything imports onnxruntime (a test module may import it before graphllm)
os.environ["ORT_DISABLE_TELEMETRY"] = "1"

# isort: split
from collections.abc import Callable
from pathlib import Path

import pytest

import graphllm
from graphllm.build.builder import build_export_graph
from graphllm.exporters.onnx import export_onnx
from tests.support.browser import chromium_browser, open_page  # noqa: F401  (fixtures)
from tests.support.paths import EXAMPLES


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> Path:
    """A cache folder of the test's own, so that a real calibration never leaks in or out."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="session")
def tiny_onnx(tmp_path_factory) -> Path:
    """examples/tiny.yaml exported with random weights (seed 1) and the default lowering."""
    path = tmp_path_factory.mktemp("tiny-onnx") / "tiny.onnx"
    export_onnx(build_export_graph(graphllm.load_config(EXAMPLES / "tiny.yaml")), path, seed=1)
    return path


def _built_once(kind: type, tmp_path_factory) -> Callable:
    """(case, **overrides) -> its `kind` model in a folder of its own, each built once."""
    models: dict[tuple, object] = {}

    def get(case: str, **overrides):
        key = (case, *sorted(overrides.items()))
        if key not in models:
            name = "-".join([case, *(f"{k}{v}" for k, v in sorted(overrides.items()))])
            models[key] = kind(case, tmp_path_factory.mktemp(name), **overrides)
        return models[key]

    return get


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Callable:
    """case -> tests.support.tiny_models.TinyModel: a tiny transformers model of one family with
    random weights, its save_pretrained folder, graphllm's config and weights for it."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tests.support.tiny_models import TinyModel

    return _built_once(TinyModel, tmp_path_factory)


@pytest.fixture(scope="session")
def tiny_deepseek(tmp_path_factory) -> Callable:
    """case -> tests.support.tiny_deepseek.TinyDeepSeek: as `tiny_model`, for DeepSeek-V2/V3."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tests.support.tiny_deepseek import TinyDeepSeek

    return _built_once(TinyDeepSeek, tmp_path_factory)


@pytest.fixture(scope="session")
def tiny_qwen3_next(tmp_path_factory) -> Callable:
    """case -> tests.support.tiny_qwen3_next.TinyQwen3Next: as `tiny_model`, for Qwen3-Next."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tests.support.tiny_qwen3_next import TinyQwen3Next

    return _built_once(TinyQwen3Next, tmp_path_factory)


@pytest.fixture(scope="session")
def tiny_mtp(tmp_path_factory):
    """tests.support.mtp.TinyMTP: a tiny V3 checkpoint with an MTP layer beside it, in a folder
    of its own (tiny_deepseek's v3-noaux folder stays a checkpoint without MTP tensors)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tests.support.mtp import TinyMTP
    from tests.support.tiny_deepseek import TinyDeepSeek

    return TinyMTP(TinyDeepSeek("v3-noaux", tmp_path_factory.mktemp("v3-mtp")))


@pytest.fixture(scope="session")
def tiny_nemotron(tmp_path_factory) -> Callable:
    """issue 19: case -> tests.support.tiny_nemotron.TinyNemotron (as `tiny_model`)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tests.support.tiny_nemotron import TinyNemotron

    return _built_once(TinyNemotron, tmp_path_factory)
