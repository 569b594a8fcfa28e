"""What graphllm reads from an `.onnx` file is not trusted: mutated metadata either loads or is
one GraphllmError; onnxruntime's telemetry never writes a file; the execution budgets price
runs before they start."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphllm.build.builder import build_graph
from graphllm.build.weights import random_weights
from graphllm.errors import GraphllmError
from graphllm.exporters.onnx import metadata_from_props, read_metadata
from graphllm.models.config import load_config
from graphllm.models.workload import Workload
from graphllm.runtime import budget, calibrate
from graphllm.runtime.interpret import run_graph
from tests.support.hostile import run_cli
from tests.support.onnx_files import tiny_export, tiny_props
from tests.support.paths import EXAMPLES

pytest.importorskip("onnxruntime")

# JSON values of every kind, nested a little: what a hostile or careless edit puts in a field
_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
_json = st.recursive(
    _leaf,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


def _mutated(props: dict[str, str], key: str, field: str | None, value: object) -> dict[str, str]:
    """`props` with one metadata key replaced by `value`, or one field of its JSON mapping."""
    out = dict(props)
    if field is None:
        out[key] = value if isinstance(value, str) else json.dumps(value)
        return out
    doc = json.loads(out.get(key, "{}"))
    doc[field] = value
    out[key] = json.dumps(doc)
    return out


PROPS = tiny_props()
CONFIG_FIELDS = sorted(json.loads(PROPS["graphllm.config"]))
WORKLOAD_FIELDS = sorted(json.loads(PROPS["graphllm.workload"]))


def _loads_or_refuses(props: dict[str, str]) -> None:
    """Loading, and building the graph bench predicts from, succeed or raise GraphllmError."""
    try:
        meta = metadata_from_props(props, "m.onnx")
        build_graph(meta.config, meta.workload, **meta.build)
    except GraphllmError as e:
        assert "\n" not in str(e) and len(str(e)) < 1000


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(CONFIG_FIELDS), value=_json)
def test_a_mutated_config_field_loads_or_is_one_error(field, value):
    _loads_or_refuses(_mutated(PROPS, "graphllm.config", field, value))


@settings(max_examples=40, deadline=None)
@given(field=st.sampled_from(WORKLOAD_FIELDS + ["bogus"]), value=_json)
def test_a_mutated_workload_field_loads_or_is_one_error(field, value):
    _loads_or_refuses(_mutated(PROPS, "graphllm.workload", field, value))


@settings(max_examples=40, deadline=None)
@given(
    key=st.sampled_from(sorted(PROPS) + ["graphllm.graph"]),
    value=st.one_of(_json, st.text(max_size=40)),
)
def test_a_replaced_metadata_value_loads_or_is_one_error(key, value):
    _loads_or_refuses(_mutated(PROPS, key, None, value))


@settings(max_examples=30, deadline=None)
@given(data=st.binary(max_size=64), at=st.integers(min_value=0, max_value=len(tiny_export())))
def test_damaged_bytes_load_or_are_one_error(tmp_path_factory, data, at):
    """Bytes spliced into the file: protobuf and graphllm's checks answer, never a traceback."""
    path = tmp_path_factory.mktemp("damaged") / "m.onnx"
    blob = tiny_export()
    path.write_bytes(blob[:at] + data + blob[at + len(data) :])
    with contextlib.suppress(GraphllmError):
        read_metadata(path)


def test_the_unmutated_metadata_loads():
    meta = metadata_from_props(PROPS, "m.onnx")
    assert meta.config == load_config(EXAMPLES / "tiny.yaml")


# -- telemetry ---------------------------------------------------------------------------------
def _fresh_env(root: Path) -> dict[str, str]:
    """An environment with an empty home and temporary folder, and no telemetry setting of the
    test run's own (conftest sets it): what graphllm sets is what is tested. Without CI too:
    onnxruntime 1.32 writes no telemetry when CI is set, which would make these checks pass on
    the CI machine whatever graphllm did."""
    for sub in ("home", "tmp"):
        (root / sub).mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("ORT_DISABLE_TELEMETRY", "CI")}
    return env | {"HOME": str(root / "home"), "TMPDIR": str(root / "tmp"), "XDG_CACHE_HOME": ""}


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize(
    "code",
    ["import graphllm; import onnxruntime", "import graphllm.runtime.session, onnxruntime"],
)
def test_importing_graphllm_turns_onnxruntime_telemetry_off(tmp_path, code):
    subprocess.run([sys.executable, "-c", code], env=_fresh_env(tmp_path), check=True)
    assert _files(tmp_path) == []


def test_onnxruntime_alone_would_write_telemetry(tmp_path):
    """The check above can fail: without graphllm, the same import writes its store."""
    subprocess.run(
        [sys.executable, "-c", "import onnxruntime"], env=_fresh_env(tmp_path), check=True
    )
    if not _files(tmp_path):
        pytest.skip("this onnxruntime build writes no telemetry files")


def test_bench_writes_no_telemetry(tmp_path):
    (tmp_path / "m.onnx").write_bytes(tiny_export())
    r = run_cli(
        ["bench", "m.onnx", "--no-predict", "--prompt-len", "2", "--new-tokens", "1",
         "--repeats", "1", "--warmup", "0", "--json"],
        tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert _files(tmp_path) == ["m.onnx"]


# -- budgets -----------------------------------------------------------------------------------
TINY = load_config(EXAMPLES / "tiny.yaml")


@pytest.mark.parametrize("batch", [1, 8])
def test_interpreted_bytes_cover_what_a_run_allocates(batch):
    """The estimate is at least the run's peak (weights made for it included), and not so far
    above it that a run that fits is refused."""
    graph = build_graph(TINY, Workload(batch=batch, seq_len=16, past_len=0))
    tracemalloc.start()
    run_graph(graph, random_weights(graph, seed=0), np.ones((batch, 16), np.int64))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak <= budget.interpreted_bytes(graph) <= 4 * peak


def test_an_interpreted_run_past_the_memory_left_is_refused(monkeypatch):
    graph = build_graph(TINY, Workload(batch=2, seq_len=4))
    monkeypatch.setattr("graphllm.limits.memory_available", lambda: 1 << 10)
    with pytest.raises(GraphllmError, match=r"needs .* of memory; this process has 1\.0 KiB"):
        run_graph(graph, {}, [[1, 2, 3, 4]] * 2)


def test_bench_bytes_count_the_cache_logits_scores_and_masks():
    # one layer of K and V, 2 heads of 16 fp32: the cache held twice at 10 + 5 positions
    need = budget.bench_bytes(
        [(2, 16, 4), (2, 16, 4)], vocab=100, heads=4, batch=3, prompt_len=10, new_tokens=5
    )
    cache = 2 * 2 * 3 * 2 * 15 * 16 * 4
    logits = 3 * 10 * 100 * 4
    scores = 2 * 3 * 4 * 10 * 10 * 4  # with their softmax
    masks = 2 * 8 * 3 * sum(10 + i for i in range(6))
    assert need == cache + logits + scores + masks


def test_threads_are_bounded_per_cpu():
    budget.require_threads(budget.max_threads(), "bench")
    with pytest.raises(GraphllmError, match="is more than"):
        budget.require_threads(budget.max_threads() + 1, "bench")


def test_calibrate_sizes_its_buffers_from_the_memory_this_process_may_use(monkeypatch):
    seen = {}
    monkeypatch.setattr(calibrate, "memory_available", lambda: 600 << 20)
    monkeypatch.setattr(calibrate, "_llc_bytes", lambda: 8 << 20)

    def measure(matmul, buffer, model, threads, repeats, progress):
        seen.update(buffer=buffer, model=model)
        return 1e12, 1e11, {}  # figures a real device could have

    def tables(sizes, *_):
        seen.update(sweep=sizes[-1])
        return {
            "runtime": "test",
            "read_bandwidth": [{"bytes": 1 << 20, "bandwidth": 1e11}],
            "gemm": [{"m": 1, "k": 8, "n": 8, "flops": 1e12}],
        }

    monkeypatch.setattr(calibrate, "_measure", measure)
    monkeypatch.setattr(calibrate, "_tables", tables)
    calibrate.calibrate(weights_bytes=800e9, repeats=1, progress=False, matmul_size=64)
    # the sweep holds its weights and onnxruntime's prepacked copy: a quarter of 600 MiB
    assert seen == {"buffer": 300 << 20, "model": 300 << 20, "sweep": 148 << 20}


def test_calibrate_without_room_to_read_past_the_cache_is_refused(monkeypatch):
    monkeypatch.setattr(calibrate, "memory_available", lambda: 100 << 20)
    monkeypatch.setattr(calibrate, "_llc_bytes", lambda: 32 << 20)
    with pytest.raises(GraphllmError, match=r"at least 128\.0 MiB .* 100\.0 MiB available"):
        calibrate.calibrate(repeats=1, progress=False, matmul_size=64)
