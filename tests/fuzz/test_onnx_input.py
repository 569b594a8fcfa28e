"""Hostile `.onnx` files given to `graphllm bench`: not a file, not ONNX, not graphllm's, damaged,
or carrying metadata that does not validate as a config and workload. Each is one line naming
the file and the problem, and nothing is left behind."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.hostile import Case, cases_params, check_case
from tests.support.onnx_files import (
    DROP,
    deep_json,
    foreign_model,
    tiny_config,
    tiny_export,
    with_config,
    with_metadata,
)
from tests.support.sandbox_files import both, fifo, folder, link

BENCH = ["bench", "m.onnx", "--no-predict", "--prompt-len", "2", "--new-tokens", "1"]


def _file(data: Callable[[], bytes]) -> Callable[[Path], None]:
    return lambda root: (root / "m.onnx").write_bytes(data())


def _case(id: str, data: Callable[[], bytes], expect: str) -> Case:
    return Case(id, BENCH, make=_file(data), expect=expect)


def _half() -> bytes:
    data = tiny_export()
    return data[: len(data) // 2]


NOT_FILES = [
    Case("fifo", BENCH, make=fifo("m.onnx"), expect="m.onnx: is a FIFO, not an ONNX model"),
    Case(
        "symlink-to-fifo",
        BENCH,
        make=both(fifo("pipe"), link("m.onnx", lambda root: root / "pipe")),
        expect="not an ONNX model",
    ),
    Case(
        "symlink-to-folder",
        BENCH,
        make=both(folder("dir"), link("m.onnx", lambda root: root / "dir")),
        expect="is a directory",
    ),
    Case(
        "dangling-symlink",
        BENCH,
        make=link("m.onnx", lambda root: root / "gone.onnx"),
        expect="no such ONNX model",
    ),
    Case("missing", BENCH, expect="m.onnx"),
    Case(
        "dev-null",
        ["bench", "/dev/null", "--no-predict"],
        expect="/dev/null: is a character device",
    ),
    Case(
        "dev-zero",
        ["bench", "/dev/zero", "--no-predict"],
        expect="/dev/zero: is a character device",
    ),
    Case("folder", ["bench", ".", "--no-predict"], expect="directory"),
]

DAMAGED = [
    _case("empty", lambda: b"", "m.onnx: is empty"),
    _case("one-byte", lambda: b"\x08", "m.onnx"),
    _case("random-bytes", lambda: os.urandom(4096), "m.onnx: not a readable ONNX model"),
    _case("random-megabyte", lambda: os.urandom(1 << 20), "not a readable ONNX model"),
    _case("truncated-half", _half, "m.onnx: not a readable ONNX model"),
    _case("truncated-16-bytes", lambda: tiny_export()[:16], "m.onnx"),
    _case("text-file", lambda: b"ir_version: 8\nthis is not protobuf\n", "m.onnx"),
    _case("json-file", lambda: b'{"graphllm.config": {}}', "m.onnx"),
]

NOT_GRAPHLLM = [
    _case("foreign-model", foreign_model, "m.onnx: no graphllm metadata"),
    _case(
        "metadata-stripped",
        lambda: with_metadata({k: DROP for k in ("graphllm.config", "graphllm.workload")}),
        "no graphllm metadata",
    ),
]


def _meta(id: str, changes: dict[str, object], expect: str) -> Case:
    return _case(id, lambda: with_metadata(changes), expect)


def _config(id: str, expect: str, **fields: object) -> Case:
    return _case(id, lambda: with_config(**fields), expect)


METADATA = [
    _meta(
        "config-a-list",
        {"graphllm.config": [1, 2]},
        "graphllm.config: config fields must be a mapping",
    ),
    _meta("config-a-string", {"graphllm.config": '"llama"'}, "config fields must be a mapping"),
    _meta("config-null", {"graphllm.config": "null"}, "graphllm.config"),
    _meta("config-not-json", {"graphllm.config": "{not json"}, "graphllm.config"),
    _meta("config-deep-json", {"graphllm.config": deep_json(100_000)}, "nested too deep"),
    _meta("config-deep-object", {"graphllm.config": '{"a":' * 100_000}, "graphllm.config"),
    _meta("config-5000-digits", {"graphllm.config": "9" * 5000}, "graphllm.config"),
    _meta("workload-a-list", {"graphllm.workload": ["batch"]}, "graphllm.workload"),
    _meta("workload-deep-json", {"graphllm.workload": deep_json(100_000)}, "nested too deep"),
    _meta("workload-unknown-key", {"graphllm.workload": {"bogus": 1}}, "graphllm.workload"),
    _meta("workload-batch-0", {"graphllm.workload": {"batch": 0}}, "batch must be a positive"),
    _meta("workload-dtype-bogus", {"graphllm.workload": {"act_dtype": "fp7"}}, "fp7"),
    _meta("workload-dtype-list", {"graphllm.workload": {"act_dtype": [1]}}, "graphllm.workload"),
    _meta("workload-missing", {"graphllm.workload": DROP}, "graphllm.workload: missing"),
    _meta("graph-a-list", {"graphllm.graph": [1]}, "graphllm.graph"),
    _meta("graph-unknown-key", {"graphllm.graph": {"layers": 3}}, "unknown key 'layers'"),
    _meta("graph-mla-bogus", {"graphllm.graph": {"mla": "half"}}, "'half' is not one of"),
    _meta("graph-mtp-string", {"graphllm.graph": {"mtp": "yes"}}, "mtp must be true or false"),
    _meta("lowering-unknown", {"graphllm.lowering": "fast"}, "graphllm.lowering"),
    _meta("lowering-missing", {"graphllm.lowering": DROP}, "graphllm.lowering: missing"),
    _meta("weights-missing", {"graphllm.weights": DROP}, "graphllm.weights: missing"),
    _config("kv-heads-0", "num_key_value_heads must be a positive", num_key_value_heads=0),
    _config("kv-heads-negative", "num_key_value_heads", num_key_value_heads=-2),
    _config("hidden-size-string", "hidden_size must be", hidden_size="64"),
    _config("hidden-size-true", "hidden_size must be", hidden_size=True),
    _config("hidden-size-float", "hidden_size must be", hidden_size=64.5),
    _config("vocab-missing", "config field 'vocab_size' is missing", vocab_size=DROP),
    _config("name-missing", "config field 'name' is missing", name=DROP),
    _config("unknown-field", "unknown config field 'bogus'", bogus=1),
    _config("rope-a-list", "rope must be a RopeConfig", rope=[10000.0]),
    _config("rope-theta-string", "rope.theta must be a finite number", rope={"theta": "big"}),
    _config("rope-unknown-field", "unknown config field rope.", rope={"spin": 1}),
    _config("layer-types-string", "layer_types must be a list", layer_types="full_attention"),
    _config("layer-types-bogus", "layer_types", layer_types=["full_attention", "mamba"]),
    _config("heads-not-multiple", "not a multiple", num_attention_heads=3),
    _config("eps-nan", "rms_norm_eps must be a finite number", rms_norm_eps=float("nan")),
    _config("name-100k", "name is a string of 100,000 characters", name="x" * 100_000),
    _config("block-a-number", "block must be a BlockLayout", block=3),
]


def test_the_tiny_export_is_refused_only_when_changed(tmp_path):
    """The corpus's base file benches: each case's refusal is its change's, not the base's."""
    (tmp_path / "m.onnx").write_bytes(with_config(**tiny_config()))
    from tests.support.hostile import run_cli

    r = run_cli([*BENCH, "--repeats", "1", "--warmup", "0", "--json"], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]


CASES = NOT_FILES + DAMAGED + NOT_GRAPHLLM + METADATA


@pytest.mark.parametrize("case", cases_params(CASES))
def test_refused(case, tmp_path):
    check_case(case, tmp_path)
