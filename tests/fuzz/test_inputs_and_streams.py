"""Outputs that would replace the command's own inputs, arguments no file system name can carry
to onnx or onnxruntime (bytes that are not UTF-8), a closed stdout, out-of-range seeds and
repetition counts, and an export's data record tampered with: each refused in one line, before
any work, with the inputs left as they were."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import onnx
import pytest
from onnx.external_data_helper import convert_model_to_external_data

from tests.support.checkpoints import write_checkpoint
from tests.support.hostile import ENTRY, Case, cases_params, check_case, run_cli, sandbox_env, tree
from tests.support.onnx_files import deep_json, tiny_export
from tests.support.paths import EXAMPLES

TINY = EXAMPLES / "tiny.yaml"
NOT_UTF8 = os.fsdecode(b"b\xffd")  # what Python makes of a name that is not UTF-8


def _config(root: Path) -> None:
    shutil.copy(TINY, root / "t.yaml")


def _checkpoint(root: Path) -> None:
    write_checkpoint(root / "ck")


def _named(name: str, source: Callable[[Path], None] = _config) -> Callable[[Path], None]:
    def make(root: Path) -> None:
        source(root)
        made = root / ("ck" if source is _checkpoint else "t.yaml")
        made.rename(root / name)

    return make


def _external(data_record: str) -> Callable[[Path], None]:
    """The tiny export with its weights in an external file and `graphllm.data` set as given."""

    def make(root: Path) -> None:
        model = onnx.load_from_string(tiny_export())
        convert_model_to_external_data(model, location="w.data", size_threshold=0)
        model.metadata_props.add(key="graphllm.data", value=data_record)
        onnx.save(model, str(root / "m.onnx"))

    return make


REPLACE_INPUTS = [
    Case("export-over-its-config", ["export", "--config", "t.yaml", "-o", "t.yaml"], _config),
    Case(
        "per-op-over-its-config",
        ["trace", "--config", "t.yaml", "--per-op", "csv", "t.yaml"],
        _config,
    ),
    Case("plot-over-its-config", ["trace", "--config", "t.yaml", "--plot", "t.yaml"], _config),
    Case(
        "render-over-a-file-in-the-checkpoint",
        ["render", "--view", "model", "--config", "ck", "-o", "ck/model.svg"],
        lambda root: (_checkpoint(root), (root / "ck" / "model.svg").write_text("<svg/>")),
    ),
    Case(
        "trace-file-over-its-config",
        ["partition", "--config", "t.yaml", "--tp", "2", "--trace", "t.yaml"],
        _config,
    ),
    Case(
        "export-over-a-hard-link-to-its-config",
        ["export", "--config", "t.yaml", "-o", "same.yaml"],
        lambda root: (_config(root), os.link(root / "t.yaml", root / "same.yaml")),
    ),
    Case(
        "export-over-the-checkpoint",
        ["export", "--weights", "ck", "--device", "cpu", "-o", "ck/model.safetensors"],
        _checkpoint,
    ),
    Case(
        "export-over-the-checkpoint-config",
        ["export", "--weights", "ck", "--device", "cpu", "-o", "ck/config.json"],
        _checkpoint,
    ),
]
for case in REPLACE_INPUTS:
    case.expect = "one of this command's inputs"

NOT_UTF8_NAMES = [
    Case("config-name", ["trace", "--config", NOT_UTF8 + ".yaml"], _named("b\udcffd.yaml")),
    Case("export-target", ["export", "--config", str(TINY), "-o", NOT_UTF8 + ".onnx"]),
    Case("render-target", ["render", "--config", str(TINY), "-o", NOT_UTF8 + ".svg"]),
    Case("bench-model", ["bench", NOT_UTF8 + ".onnx", "--no-predict"]),
    Case("weights-folder", ["export", "--weights", NOT_UTF8, "-o", "m.onnx"]),
    Case("model-name", ["trace", "--model", NOT_UTF8]),
]
for case in NOT_UTF8_NAMES:
    case.id = f"not-utf8-{case.id}"
    case.expect = "is not valid UTF-8"

RANGES = [
    Case("export-seed-negative", ["export", "--config", str(TINY), "--seed", "-1", "-o", "m.onnx"]),
    Case("tokens-seed-negative", ["verify", "tokens", "--config", str(TINY), "--seed", "-1"]),
    Case(
        "partition-seed-negative",
        ["verify", "partition", "--config", str(TINY), "--tp", "2", "--seed", "-5"],
    ),
    Case(
        "export-seed-2e64", ["export", "--config", str(TINY), "--seed", str(2**64), "-o", "m.onnx"]
    ),
    Case("bench-repeats-1e9", ["bench", "--config", str(TINY), "--repeats", "1000000000"]),
    Case("bench-warmup-1e9", ["bench", "--config", str(TINY), "--warmup", "1000000000"]),
    Case("calibrate-repeats-1e9", ["calibrate", "--repeats", "1000000000"]),
    Case("export-empty-name", ["export", "--config", str(TINY), "-o", ""], expect="file name"),
]
for case in RANGES:
    case.expect = case.expect or "range"

DATA_RECORDS = [
    Case(
        "data-bytes-1e400",
        ["bench", "m.onnx", "--no-predict"],
        _external('{"file": "w.data", "bytes": 1e400, "token": "x"}'),
    ),
    Case("data-deep", ["bench", "m.onnx", "--no-predict"], _external(deep_json(100_000))),
    Case(
        "data-bytes-negative",
        ["bench", "m.onnx", "--no-predict"],
        _external('{"file": "w.data", "bytes": -1, "token": "x"}'),
    ),
    Case(
        "data-file-a-number",
        ["bench", "m.onnx", "--no-predict"],
        _external('{"file": 7, "bytes": 1, "token": "x"}'),
    ),
    Case("data-a-string", ["bench", "m.onnx", "--no-predict"], _external('"w.data"')),
]
for case in DATA_RECORDS:
    case.expect = "unreadable graphllm.data metadata"


@pytest.mark.parametrize(
    "case", cases_params(REPLACE_INPUTS + NOT_UTF8_NAMES + RANGES + DATA_RECORDS)
)
def test_refused(case: Case, tmp_path: Path) -> None:
    check_case(case, tmp_path)


def test_an_input_refused_as_output_is_left_as_it_was(tmp_path: Path) -> None:
    _checkpoint(tmp_path)
    before = {p: p.read_bytes() for p in (tmp_path / "ck").iterdir()}
    check_case(next(c for c in REPLACE_INPUTS if c.id == "export-over-the-checkpoint"), tmp_path)
    assert {p: p.read_bytes() for p in (tmp_path / "ck").iterdir()} == before


def test_a_new_file_beside_the_checkpoint_is_written(tmp_path: Path) -> None:
    _checkpoint(tmp_path)
    r = run_cli(["export", "--weights", "ck", "--device", "cpu", "-o", "ck/tiny.onnx"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "ck" / "tiny.onnx").is_file()


def test_a_closed_stdout_is_one_line(tmp_path: Path) -> None:
    """Started as `graphllm ... >&-`: the child's fd 1 is closed before it runs."""
    before = tree(tmp_path)
    for args in (["presets"], ["trace", "--model", "llama3-8b", "--json"]):
        p = subprocess.run(
            [sys.executable, "-c", ENTRY, *args],
            cwd=tmp_path,
            env=sandbox_env(tmp_path),
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=lambda: os.close(1),
            timeout=60,
        )
        assert p.returncode == 2, p.stderr
        assert (
            p.stderr.decode().strip()
            == "error: stdout is closed; graphllm prints its results there"
        )
    assert tree(tmp_path) - before - {"home", "tmp"} == set()
